-- SPDX-License-Identifier: MIT
--! include whole
-- The read-write lock's shared steps. KEYS[1] is always its readers, a
-- sorted set by expiry; the writer key holds the writer's token.
--
-- rw_mark(waiters, token, left, now): a read-write lock's waiter stays in
-- the waiters set until it could have taken the lock (left ms from now)
-- and a second more.
local function rw_mark(waiters, token, left, now)
  redis.call('ZADD', waiters, whole(now + math.max(left, 0) + RL_WAITERS_SLACK_MS), token)
  local wlast = tonumber(redis.call('ZRANGE', waiters, -1, -1, 'WITHSCORES')[2])
  redis.call('PEXPIRE', waiters, whole(math.max(wlast - now, 1)))
end
