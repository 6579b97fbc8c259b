-- SPDX-License-Identifier: MIT
--! include first_live hand_to_heir wake_all
-- rw_hand_or_wake(k, now): with no reader in, and the writer key (k.lock)
-- free or the releasing writer's: hands the write lock to the first live
-- registered writer (as hand_to_heir hands a lock: the key takes its
-- token, k.handed is set; the heir leaves the waiting writers, k.writers),
-- else wakes every waiter (k.waiters).
local function rw_hand_or_wake(k, now)
  local heir, hms, since = first_live(k.queue, k.hand, now)
  if heir then
    hand_to_heir(k, heir, hms, since, false, now)
    if k.handed then redis.call('ZREM', k.writers, heir) end
  end
  if not k.handed then wake_all(k.signal, k.waiters, now) end
end
