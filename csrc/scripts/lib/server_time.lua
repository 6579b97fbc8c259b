-- SPDX-License-Identifier: MIT
-- server_time() -> now, t: the server's clock in ms, and TIME's reply.
local function server_time()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000), t
end
