-- SPDX-License-Identifier: MIT
-- A TCP proxy for the resend spec: forwards bytes between its clients and a
-- redis-server, except that the first client write containing `marker` is
-- forwarded to the server and then the client's connection is closed at
-- once: the command was sent and runs, its reply never comes back. Each
-- client gets a connection of its own to the server (spec/workers/relay.lua).
-- usage: drop_proxy.lua <listen port> <redis port> <marker> <quit file>
-- Runs until <quit file> exists; prints "dropped <n>" (0 or 1) at the end,
-- and after a drop "lost <reply>": the replies the client never got, their
-- lines joined by spaces (e.g. ":<fence>" of an acquire script, "+OK
-- +QUEUED +QUEUED *2 +OK $15 <ms>-<seq>" of a take that took the lock).
local socket = require("socket")
local relay = require("spec.workers.relay")

local marker = arg[3]
local dropped, lost = 0, nil
local r = { listen = tonumber(arg[1]), redis = tonumber(arg[2]), quit = arg[4], tick = 0.05 }

function r.write(s, data, o)
  relay.send(o, data)
  if dropped ~= 0 or not data:find(marker, 1, true) then return end
  dropped = 1
  -- The server got the command; the client gets no answer, only the close.
  r.peer[s], r.peer[o], r.from_client[s] = nil, nil, nil
  s:close()
  socket.sleep(0.2) -- let the server run it before its side goes too
  o:settimeout(1)
  local line = o:receive("*l")
  local lines = { line }
  -- The rest of the replies (a take's five) came in the same write,
  -- or come right after.
  o:settimeout(0.1)
  while line do
    line = o:receive("*l")
    lines[#lines + 1] = line
  end
  lost = lines[1] and table.concat(lines, " ")
  o:close()
end

relay.run(r)
print("dropped " .. dropped)
if lost then print("lost " .. lost) end
