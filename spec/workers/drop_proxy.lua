-- SPDX-License-Identifier: MIT
-- A TCP proxy for the resend spec: forwards bytes between its clients and a
-- redis-server, except that the first client write containing `marker` is
-- forwarded to the server and then the client's connection is closed at
-- once: the command was sent and runs, its reply never comes back. Each
-- client gets a connection of its own to the server.
-- usage: drop_proxy.lua <listen port> <redis port> <marker> <quit file>
-- Runs until <quit file> exists; prints "dropped <n>" (0 or 1) at the end,
-- and after a drop "lost <reply>": the replies the client never got, their
-- lines joined by spaces (e.g. ":<fence>" of an acquire script, "+OK
-- +QUEUED +QUEUED *2 +OK $15 <ms>-<seq>" of a take that took the lock).
local socket = require "socket"

local listen_port, redis_port, marker, quit_file = tonumber(arg[1]), tonumber(arg[2]), arg[3], arg[4]
local server = assert(socket.bind("127.0.0.1", listen_port))
server:settimeout(0)

local peer = {}   -- socket -> the other end
local from_client = {} -- socket -> true for a client's side
local dropped, lost = 0, nil

local function close_pair(s)
  local o = peer[s]
  peer[s], from_client[s] = nil, nil
  s:close()
  if o then
    peer[o], from_client[o] = nil, nil
    o:close()
  end
end

local function quit()
  local f = io.open(quit_file, "r")
  if f then f:close() end
  return f ~= nil
end

while not quit() do
  local readers = { server }
  for s in pairs(peer) do readers[#readers + 1] = s end
  local ready = socket.select(readers, nil, 0.05)
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
          peer[c], peer[up], from_client[c] = up, c, true
        else
          c:close()
        end
      end
    elseif peer[s] then
      local data, err, partial = s:receive(65536)
      data = data or partial
      if data and data ~= "" then
        local o = peer[s]
        o:settimeout(2)
        o:send(data)
        o:settimeout(0)
        if from_client[s] and dropped == 0 and data:find(marker, 1, true) then
          dropped = 1
          -- The server got the command; the client gets no answer, only the close.
          peer[s], peer[o], from_client[s] = nil, nil, nil
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
      end
      if err == "closed" and peer[s] then close_pair(s) end
    end
  end
end
print("dropped " .. dropped)
if lost then print("lost " .. lost) end
