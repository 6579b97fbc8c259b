-- SPDX-License-Identifier: MIT
--! op sem_acquire_wait keys=permits,pfence,pqueue,phand,pwaiters,era,phanded flags=ms,n,stay
-- sem_acquire_wait: KEYS permits, fence, queue, hand, waiters, era, handed;
-- ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] the limit, ARGV[4] how long its
-- registration lasts (ms). A waiter's try: sem_acquire's, which registers
-- the waiter for a handoff (of a permit for its ttl) when none is free, and
-- drops its registration when it takes one. Replies as acquire.
--! include fence_of register_in sem_handed_fence sem_reclaim server_time whole zset_expire
local now, t = server_time()
sem_reclaim(KEYS[1], KEYS[7], now)
local resent = redis.call('ZSCORE', KEYS[1], ARGV[1])
if resent or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], whole(now + tonumber(ARGV[2])), ARGV[1])
  zset_expire(KEYS[1], now)
  local handed_fence = resent and sem_handed_fence(KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
  if handed_fence then return handed_fence end
  return fence_of(KEYS[2], KEYS[6])
end
local left = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]) - now
register_in(KEYS[1] .. ':signal', KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[4], now, t)
redis.call('SET', KEYS[5], 1, 'PX', math.max(left, tonumber(ARGV[4])) + RL_WAITERS_SLACK_MS)
return -2 - left
