-- SPDX-License-Identifier: MIT
--! include whole
-- Holders kept in a sorted set by expiry (semaphore permits, readers).
--
-- zset_expire(z, now): the set lasts as long as its last holder.
local function zset_expire(z, now)
  local last = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')[2]
  if last then redis.call('PEXPIRE', z, whole(math.max(tonumber(last) - now, 1))) end
end
