-- SPDX-License-Identifier: MIT
--! op read_acquire keys=readers,writer,rwfence,writers,rwwaiters,era,rwsignal flags=ms,stay
-- read_acquire: KEYS readers, writer, fence, writers, waiters, era, signal;
-- ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] how long a waiting writer stays
-- queued (ms). A reader gets in when no writer holds the lock and none
-- waits (writers first: a stream of readers cannot starve one). The write
-- lock handed to a writer that never took it up is taken back (stale).
-- Replies as acquire: the fence, or -2 - ms until it may change (the
-- writer's PTTL, or the last waiting writer's stay).
--! include fence_of rw_mark server_time stale whole zset_expire
local now = server_time()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local resent = redis.call('ZSCORE', KEYS[1], ARGV[1])
local wleft = redis.call('PTTL', KEYS[2])
local s = wleft >= 0 and not resent and stale(KEYS[2], KEYS[7], redis.call('GET', KEYS[2]))
if s == 0 then wleft = -2 elseif s and s < wleft then wleft = s end
if resent or (wleft == -2 and redis.call('ZCARD', KEYS[4]) == 0) then
  redis.call('ZADD', KEYS[1], whole(now + tonumber(ARGV[2])), ARGV[1])
  zset_expire(KEYS[1], now)
  redis.call('ZREM', KEYS[5], ARGV[1])
  return fence_of(KEYS[3], KEYS[6])
end
local left = wleft
if left < 0 then
  local w = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]
  left = w and tonumber(w) - now or tonumber(ARGV[3])
end
rw_mark(KEYS[5], ARGV[1], left, now)
return -2 - left
