-- SPDX-License-Identifier: MIT
-- A TCP proxy for spec/48: forwards bytes between its clients and a
-- redis-server, but holds back each write of a connection whose first write
-- is no take (no MULTI: the watchdog's renewals) for `delay` seconds before
-- it goes on, in order. Each client gets a connection of its own to the
-- server (spec/workers/relay.lua). Every held write is logged to <log> as
-- "held <t> sent <t>" (wall clock seconds) once it was sent on; a client
-- that closed its connection meanwhile does not take its held writes back
-- (they were on their way).
-- usage: delay_proxy.lua <listen port> <redis port> <delay> <log> <quit file>
-- Runs until <quit file> exists.
local socket = require("socket")
local relay = require("spec.workers.relay")

local delay, log_file = tonumber(arg[3]), arg[4]
local r = { listen = tonumber(arg[1]), redis = tonumber(arg[2]), quit = arg[5], tick = 0.005 }
local slow = {}     -- a client's socket -> true when its writes are held back, false when not
local held = {}     -- a client's socket -> its writes held back: { at =, data =, since = }, in order
local draining = {} -- a server side whose client left -> the client's writes still held back

function r.write(s, data, o)
  if slow[s] == nil then slow[s] = not data:find("MULTI", 1, true) end
  if not slow[s] then return relay.send(o, data) end
  local now = socket.gettime()
  held[s] = held[s] or {}
  table.insert(held[s], { at = now + delay, data = data, since = now })
end

function r.closed(s)
  local q, up = held[s], r.peer[s]
  slow[s], held[s] = nil, nil
  if not (r.from_client[s] and q and #q > 0) then
    if up then slow[up], held[up] = nil, nil end
    return false
  end
  -- Gone, but its held writes go on: then the server side closes.
  r.peer[s], r.peer[up], r.from_client[s] = nil, nil, nil
  s:close()
  draining[up] = q
  return true
end

-- Sends on the writes of q that are due, to o.
local function due(q, o)
  local now = socket.gettime()
  while q[1] and q[1].at <= now do
    relay.send(o, q[1].data)
    local f = io.open(log_file, "a")
    f:write(string.format("held %.3f sent %.3f\n", q[1].since, socket.gettime()))
    f:close()
    table.remove(q, 1)
  end
end

function r.idle()
  for s, q in pairs(held) do due(q, r.peer[s]) end
  for up, q in pairs(draining) do
    due(q, up)
    if #q == 0 then
      draining[up] = nil
      up:close()
    end
  end
end

relay.run(r)
