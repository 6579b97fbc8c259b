-- SPDX-License-Identifier: MIT
-- What the specs' TCP proxies share (drop_proxy.lua, delay_proxy.lua): a
-- relay between its clients and a redis-server on loopback, each client
-- with a connection of its own to the server, that runs until a quit file
-- exists. The proxy decides what becomes of each piece a client writes.
local socket = require("socket")

local M = {}

--- Sends data on o whole (blocking up to 2 s), then makes o non-blocking again.
function M.send(o, data)
  o:settimeout(2)
  o:send(data)
  o:settimeout(0)
end

--- Runs the relay. r: listen (port), redis (port), quit (file), tick (the
-- longest wait for a socket, seconds), and the proxy's hooks:
--   r.write(s, data, o): a client's side s wrote data, o its server side;
--                        the hook sends it on (M.send) or keeps it
--   r.closed(s): s's peer closed; true when the hook dealt with the pair
--                (else both sides are closed)
--   r.idle(): after every wait
-- r.peer (socket -> the other end) and r.from_client (socket -> true for
-- a client's side) are the relay's tables, which hooks may change.
function M.run(r)
  local server = assert(socket.bind("127.0.0.1", r.listen))
  server:settimeout(0)
  r.peer, r.from_client = {}, {}
  local peer, from_client = r.peer, r.from_client
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
    local f = io.open(r.quit, "r")
    if f then f:close() end
    return f ~= nil
  end
  while not quit() do
    local readers = { server }
    for s in pairs(peer) do readers[#readers + 1] = s end
    for _, s in ipairs((socket.select(readers, nil, r.tick))) do
      if s == server then
        local c = server:accept()
        if c then
          local up = socket.tcp()
          up:settimeout(2)
          if up:connect("127.0.0.1", r.redis) then
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
          if from_client[s] then r.write(s, data, peer[s]) else M.send(peer[s], data) end
        end
        if err == "closed" and peer[s] and not (r.closed and r.closed(s)) then close_pair(s) end
      end
    end
    if r.idle then r.idle() end
  end
end

return M
