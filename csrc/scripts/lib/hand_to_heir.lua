-- SPDX-License-Identifier: MIT
--! include list next_fence whole
-- Handing a lock over (README.md, "Handing over"). Its names are passed one
-- by one, not in a table: a table costs Redis more than the rest of a
-- function call (bench/server_callgrind.sh).
--
-- hand_to_heir(lock, signal, queue, hand, fence, rec, heir, hms, since,
-- popped, now) -> true once the lock is heir's: with the lock free (its key
-- lock, its waiters' lists "<signal>:<token>", its fair queue and
-- registrations queue and hand, its holder's fence (nil for a writer's:
-- lib/grant.lua) and the slot's fence record rec),
-- hands heir (found by first_live, or first_ready: popped) the lock for hms
-- ms (since: when it registered; now: ms, server time). The wake-up
-- "<fence> <age> <at>" (age: ms since it registered, for its clock; at:
-- the server's ms now) is pushed first, as a list out of KEYS may be
-- refused (then nothing is handed over); the lock is written next, and
-- should that fail (no memory), the wake-up goes, so that nobody takes it
-- for the lock. No DEL before the RPUSH: a plain wake-up left in the list
-- ("1") only makes the waiter try once more, which finds its own token.
-- The heir then leaves the queue (redis.pcall: the lock is its whatever
-- that answers).
local function hand_to_heir(lock, signal, queue, hand, fence, rec, heir, hms, since, popped, now)
  local f = next_fence(rec)
  local sig = signal .. ':' .. heir
  local _, refused = list('RPUSH', sig, whole(f) .. ' ' .. whole(math.max(now - since, 0)) .. ' ' .. whole(now))
  if refused then return false end
  list('PEXPIRE', sig, hms)
  if redis.pcall('SET', lock, heir, 'PX', hms).err then
    list('DEL', sig)
    return false
  end
  if fence then redis.pcall('SET', fence, whole(f), 'PX', hms) end
  if not popped then
    redis.pcall('ZREM', queue, heir)
    redis.pcall('HDEL', hand, heir)
  end
  return true
end
