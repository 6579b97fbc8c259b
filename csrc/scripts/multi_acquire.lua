-- SPDX-License-Identifier: MIT
--! op multi_acquire keys=lock,fence,waiters,era flags=args,each,once
-- The multi-key acquire (redislock/multilock.lua): KEYS the n locks, then
-- their n holders' fences, then their n waiters marks, then their n
-- slots' fence records (4n keys); ARGV[1] token, ARGV[2] ttl (ms). All n locks are
-- taken, or none: when one holds another owner's token, it marks that
-- lock's waiters and replies {-1, its PTTL, its index}; else {1, {fence,
-- ...}}. Resend-safe as acquire: a lock that holds our token already is
-- taken again, with a new fence. The keys are sent in Lua's order (sorted), which only matters
-- for which busy lock is named.
--! include grant
local n = #KEYS / 4
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if v and v ~= ARGV[1] then
    local left = redis.call('PTTL', KEYS[i])
    redis.call('SET', KEYS[2 * n + i], 1, 'PX', math.max(left, 0) + RL_WAITERS_SLACK_MS)
    return {-1, left, i}
  end
end
local fences = {}
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  fences[i] = grant(KEYS[n + i], KEYS[3 * n + i], ARGV[2])
end
return {1, fences}
