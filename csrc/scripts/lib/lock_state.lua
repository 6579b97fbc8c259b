-- SPDX-License-Identifier: MIT
--! include whole
-- lock_state(lock, fence) -> { value or false, PTTL, its holder's fence or
-- false }: the state of a lock (lock, and fence, its holder's fence, kept
-- with a TTL by a script's grant: a lock taken at its first try keeps none,
-- and a counter of an earlier version, which has no TTL, is none). For an
-- election's lock that fence is the leader's term.
local function lock_state(lock, fence)
  local v = redis.call('GET', lock)
  local f = v and redis.call('PTTL', fence) > 0 and tonumber(redis.call('GET', fence))
  return { v, redis.call('PTTL', lock), f and whole(f) or false }
end
