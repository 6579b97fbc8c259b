-- SPDX-License-Identifier: MIT
--! op acquire keys=lock,fence,waiters,era flags=ms
--! op take keys=lock,fence,waiters,era flags=ms,noscript
-- acquire: KEYS lock, fence, waiters, era; ARGV[1] token, ARGV[2] ttl (ms),
-- and after a take that could not tell the fence, ARGV[3] the master ID its
-- era record names, which the connection trusts from then on when it is
-- this master's (rl_cmd_claim). Replies one integer: the fence, or -2 - the
-- holder's PTTL; or {2, the fence} when the lock is ours but this master's
-- ID is not ARGV[3] (an earlier master wrote the record: not to be
-- trusted). A lock handed to a waiter that never took it up is taken back
-- (stale, README.md "Handing over").
--
-- The take (no script: MULTI, SET NX PX, INCR, GET of the era record,
-- EXEC; rl_proto.c) falls back on this script when the lock is held or the
-- era is for the script to check. Resend-safe: if the key already holds our
-- token (an earlier send that timed out did land), it refreshes the TTL and
-- answers the counter's value (plus the era's offset), which is the fence
-- that acquisition took or larger (a take that failed since bumped it).
-- Should the counter have vanished meanwhile (FLUSHDB, eviction), it takes
-- a new value rather than answer 0.
--! include era list stale
local function ours(fence, id)
  if ARGV[3] and ARGV[3] ~= id then return {2, fence} end
  return fence
end

-- The next fence, in this master's era.
local function next_fence()
  local off, id = era(KEYS[4])
  return ours(redis.call('INCR', KEYS[2]) + off, id)
end

local function take()
  return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
end

if take() then return next_fence() end
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  list('DEL', KEYS[1] .. ':signal:' .. ARGV[1])
  local fence = tonumber(redis.call('GET', KEYS[2]))
  if fence and fence >= 1 then
    local off, id = era(KEYS[4])
    return ours(fence + off, id)
  end
  return next_fence()
end
local left = redis.call('PTTL', KEYS[1])
local s = v and stale(KEYS[1], KEYS[1] .. ':signal', v)
if s == 0 and take() then return next_fence() end
if s and s > 0 and s < left then left = s end
redis.call('SET', KEYS[3], 1, 'PX', math.max(left, 0) + RL_WAITERS_SLACK_MS)
return -2 - left
