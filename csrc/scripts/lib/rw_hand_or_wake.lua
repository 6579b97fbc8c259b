-- SPDX-License-Identifier: MIT
--! include first_live hand_to_heir wake_all
-- rw_hand_or_wake(writer, signal, waiters, queue, hand, rec, writers, now)
-- -> handed: with no reader in, and the writer key free or the
-- releasing writer's: hands the write lock to the first live registered
-- writer (as hand_to_heir hands a lock: the key takes its token; the heir
-- leaves the waiting writers, writers), else wakes every waiter (waiters).
local function rw_hand_or_wake(writer, signal, waiters, queue, hand, rec, writers, now)
  local heir, hms, since = first_live(queue, hand, now)
  if heir and hand_to_heir(writer, signal, queue, hand, nil, rec, heir, hms, since, false, now) then
    redis.pcall('ZREM', writers, heir)
    return true
  end
  wake_all(signal, waiters, now)
  return false
end
