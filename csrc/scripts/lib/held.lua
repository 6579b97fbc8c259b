-- SPDX-License-Identifier: MIT
--! include server_time
-- held(key, token, kind): whether the hold on key is token's, kind saying
-- how the hold is kept: "string" (a lock, a write lock: the key holds the
-- token) or "zset" (a semaphore's permits: the token is a member whose
-- score, its expiry on the server's clock, is still ahead).
local function held(key, token, kind)
  if kind == 'zset' then
    local s = redis.call('ZSCORE', key, token)
    return s and tonumber(s) > server_time() or false
  end
  return redis.call('GET', key) == token
end
