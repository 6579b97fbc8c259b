-- SPDX-License-Identifier: MIT
-- A TCP proxy for spec/48: forwards bytes between its clients and a
-- redis-server, but holds back each write of a connection whose first write
-- is no take (no MULTI: the watchdog's renewals) for `delay` seconds before
-- it goes on, in order. Each client gets a connection of its own to the
-- server. Every held write is logged to <log> as "held <t> sent <t>" (wall
-- clock seconds) once it was sent on; a client that closed its connection
-- meanwhile does not take its held writes back (they were on their way).
-- usage: delay_proxy.lua <listen port> <redis port> <delay> <log> <quit file>
-- Runs until <quit file> exists.
local socket = require "socket"

local listen_port, redis_port, delay = tonumber(arg[1]), tonumber(arg[2]), tonumber(arg[3])
local log_file, quit_file = arg[4], arg[5]
local server = assert(socket.bind("127.0.0.1", listen_port))
server:settimeout(0)

local peer = {}        -- socket -> the other end
local from_client = {} -- socket -> true for a client's side
local slow = {}        -- a client's socket -> true when its writes are held back, false when not
local held = {}        -- a client's socket -> its writes held back: { at =, data =, since = }, in order
local draining = {}    -- a server side whose client left -> the client's writes still held back

local function close_pair(s)
  local o = peer[s]
  peer[s], from_client[s], slow[s], held[s] = nil, nil, nil, nil
  s:close()
  if o then
    peer[o], from_client[o], slow[o], held[o] = nil, nil, nil, nil
    o:close()
  end
end

local function quit()
  local f = io.open(quit_file, "r")
  if f then f:close() end
  return f ~= nil
end

local function send(o, data)
  o:settimeout(2)
  o:send(data)
  o:settimeout(0)
end

while not quit() do
  local readers = { server }
  for s in pairs(peer) do readers[#readers + 1] = s end
  local ready = socket.select(readers, nil, 0.005)
  for _, s in ipairs(ready) do
    if s == server then
      local c = server:accept()
      if c then
        local up = socket.tcp()
        up:settimeout(2)
        if up:connect("127.0.0.1", redis_port) then
          c:settimeout(0)
          up:settimeout(0)
          c:setoption("tcp-nodelay", true)
          up:setoption("tcp-nodelay", true)
          peer[c], peer[up], from_client[c], held[c] = up, c, true, {}
        else
          c:close()
        end
      end
    elseif peer[s] then
      local data, err, partial = s:receive(65536)
      data = data or partial
      if data and data ~= "" then
        if from_client[s] and slow[s] == nil then slow[s] = not data:find("MULTI", 1, true) end
        if slow[s] then
          local now = socket.gettime()
          local q = held[s]
          q[#q + 1] = { at = now + delay, data = data, since = now }
        else
          send(peer[s], data)
        end
      end
      if err == "closed" and peer[s] then
        local q = held[s]
        if from_client[s] and q and #q > 0 then
          -- Gone, but its held writes go on: then the server side closes.
          local up = peer[s]
          peer[s], peer[up], from_client[s], slow[s], held[s] = nil, nil, nil, nil, nil
          s:close()
          draining[up] = q
        else
          close_pair(s)
        end
      end
    end
  end
  -- Sends on the writes of q that are due, to o.
  local function due(q, o)
    local now = socket.gettime()
    while q[1] and q[1].at <= now do
      send(o, q[1].data)
      local f = io.open(log_file, "a")
      f:write(string.format("held %.3f sent %.3f\n", q[1].since, socket.gettime()))
      f:close()
      table.remove(q, 1)
    end
  end
  for s, q in pairs(held) do due(q, peer[s]) end
  for up, q in pairs(draining) do
    due(q, up)
    if #q == 0 then
      draining[up] = nil
      up:close()
    end
  end
end
