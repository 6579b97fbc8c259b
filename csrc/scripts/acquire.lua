-- SPDX-License-Identifier: MIT
--! op acquire keys=lock,fence,waiters,era flags=ms
--! op take keys=lock,fence,waiters,era flags=ms,noscript
-- acquire, every acquire's first try: KEYS lock, fence (its holder's
-- fence, kept as long as the lock), waiters, era (the slot's fence record:
-- README.md, "Fences"); ARGV[1] token, ARGV[2] ttl (ms). Replies one
-- integer: the fence, or -2 - the holder's PTTL (and sets the waiters
-- mark). A lock handed to a waiter that never took it up is taken back
-- (stale, README.md "Handing over").
--
-- Resend-safe: if the key already holds our token (an earlier send that
-- timed out did land), it refreshes the TTL and answers a new fence (the
-- earlier one was never seen): above every earlier holder's, below every
-- later one's.
--! include grant list stale
local function take()
  return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
end

if take() then return grant(KEYS[2], KEYS[4], ARGV[2]) end
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  list('DEL', KEYS[1] .. ':signal:' .. ARGV[1])
  return grant(KEYS[2], KEYS[4], ARGV[2])
end
local left = redis.call('PTTL', KEYS[1])
local s = v and stale(KEYS[1], KEYS[1] .. ':signal', v)
if s == 0 and take() then return grant(KEYS[2], KEYS[4], ARGV[2]) end
if s and s > 0 and s < left then left = s end
redis.call('SET', KEYS[3], 1, 'PX', math.max(left, 0) + RL_WAITERS_SLACK_MS)
return -2 - left
