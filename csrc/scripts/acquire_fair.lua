-- SPDX-License-Identifier: MIT
--! op acquire_fair keys=lock,fence,queue,hand,waiters,era flags=ms,n,stay
-- acquire_fair: KEYS lock, fence, queue, hand, waiters, era; ARGV[1] token,
-- ARGV[2] ttl (ms), ARGV[3] the TTL a handoff gives it (ms, as
-- acquire_wait's), ARGV[4] how long a waiter stays queued without coming
-- back (ms). Takes the lock only when it is free and no live waiter came
-- first (when one did, and the lock is free, it is handed to that one);
-- else queues the token (keeping its first arrival), registered for a
-- handoff (README.md, "Handing over"), and answers {-1, PTTL of the
-- holder, or -2 when the lock is free}.
--! include first_live grant hand_to_heir list register_in server_time stale
local now, t = server_time()
local signal = KEYS[1] .. ':signal'
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  list('DEL', signal .. ':' .. ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
  return {1, grant(KEYS[2], KEYS[6], ARGV[2])}
end
local s = v and stale(KEYS[1], signal, v)
if s == 0 then v = false end
if not v then
  local heir, hms, since = first_live(KEYS[3], KEYS[4], now)
  if heir == nil or heir == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    redis.call('ZREM', KEYS[3], ARGV[1])
    redis.call('HDEL', KEYS[4], ARGV[1])
    return {1, grant(KEYS[2], KEYS[6], ARGV[2])}
  end
  hand_to_heir(KEYS[1], signal, KEYS[3], KEYS[4], KEYS[2], KEYS[6], heir, hms, since, false, now)
end
local left = redis.call('PTTL', KEYS[1])
if s and s > 0 and s < left then left = s end
register_in(signal, KEYS[3], KEYS[4], ARGV[1], ARGV[3], ARGV[4], now, t)
redis.call('SET', KEYS[5], 1, 'PX', math.max(left, tonumber(ARGV[4])) + RL_WAITERS_SLACK_MS)
return {-1, left}
