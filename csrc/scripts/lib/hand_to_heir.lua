-- SPDX-License-Identifier: MIT
--! include era list whole
-- Handing a lock over (README.md, "Handing over"). k names the lock's keys:
-- { lock, signal, queue, hand, fence, era, handoff, trust } (trust: the
-- master ID the connection vouches for, or nil: see era()).
--
-- hand_to_heir(k, heir, hms, since, popped, now): with the lock free, hands
-- heir (found by first_live, or first_ready: popped) the lock for hms ms,
-- and sets k.handed once the lock is its. The wake-up "<fence> <age> <at>"
-- (age: ms since it registered, for its clock; at: the server's ms now) is
-- pushed first, as a list out of KEYS may be refused (then nothing is
-- handed over); the lock is written next, and should that fail (no
-- memory), the wake-up goes, so that nobody takes it for the lock. No DEL
-- before the RPUSH: a plain wake-up left in the list ("1") only makes the
-- waiter try once more, which finds its own token.
local function hand_to_heir(k, heir, hms, since, popped, now)
  local f = redis.call('INCR', k.fence) + era(k.era, k.trust)
  local sig = k.signal .. ':' .. heir
  local _, refused = list('RPUSH', sig, whole(f) .. ' ' .. whole(math.max(now - since, 0)) .. ' ' .. whole(now))
  if refused then return end
  list('PEXPIRE', sig, hms)
  if redis.pcall('SET', k.lock, heir, 'PX', hms).err then
    list('DEL', sig)
    return
  end
  k.handed = true
  if not popped then
    redis.call('ZREM', k.queue, heir)
    redis.call('HDEL', k.hand, heir)
  end
end
