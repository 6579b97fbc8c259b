-- SPDX-License-Identifier: MIT
--! include whole
-- lock_state(lock, fence, rec) -> { value or false, PTTL, the last fence or
-- false }: the state of a lock (lock, its fence counter, the slot's era
-- record rec), the fence with the offset the era record holds (not checked
-- against INFO: it writes nothing). For an election's lock, taken by the
-- acquire scripts only, that fence is the leader's term.
local function lock_state(lock, fence, rec)
  local v = redis.call('GET', lock)
  local f = tonumber(redis.call('GET', fence))
  local r = redis.call('GET', rec)
  local off = r and tonumber(string.match(r, ' (%d+)$')) or 0
  return { v, redis.call('PTTL', lock), f and whole(f + off) or false }
end
