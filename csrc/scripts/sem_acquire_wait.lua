-- SPDX-License-Identifier: MIT
--! op sem_acquire_wait keys=permits,pfence,pqueue,phand,pwaiters,era,phanded flags=ms,n,stay
-- sem_acquire_wait: KEYS permits, fence, queue, hand, waiters, era, handed;
-- ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] the limit, ARGV[4] how long its
-- registration lasts (ms). A waiter's try: sem_acquire's, which registers
-- the waiter for a handoff (of a permit for its ttl) when none is free, and
-- drops its registration when it takes one. Replies as acquire.
--! include register_in sem_reclaim sem_take server_time
local now, t = server_time()
sem_reclaim(KEYS[1], KEYS[7], now)
local fence = sem_take(KEYS[1], KEYS[2], KEYS[6], ARGV[1], ARGV[2], ARGV[3], now)
if fence then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
  return fence
end
local left = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]) - now
register_in(KEYS[1] .. ':signal', KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[4], now, t)
redis.call('SET', KEYS[5], 1, 'PX', math.max(left, tonumber(ARGV[4])) + RL_WAITERS_SLACK_MS)
return -2 - left
