-- SPDX-License-Identifier: MIT
--! include list server_time
-- stale(lock, signal, v): whether the lock (the key lock, whose waiters'
-- lists are "<signal>:<token>"), held by token v, was handed to a waiter
-- that has not taken up its wake-up (the last element of its list: a plain
-- wake-up may be before it): nil when not (or not a handoff); the ms until
-- it may be taken back (RL_CLAIM_MS after the handoff); or 0 when it was
-- older and has just been taken back (the lock and the element deleted:
-- the lock is free). README.md, "Handing over".
local function stale(lock, signal, v)
  local sig = signal .. ':' .. v
  local e = list('LINDEX', sig, -1)
  local at = e and tonumber(string.match(e, ' (%d+)$'))
  if not at then return nil end
  local age = server_time() - at
  if age < RL_CLAIM_MS then return RL_CLAIM_MS - age end
  if select(2, list('DEL', sig)) then return nil end
  redis.call('DEL', lock)
  return 0
end
