-- SPDX-License-Identifier: MIT
--! include first_live first_ready hand_to_heir wake_one
-- hand_next(k, now): with the lock free, hands it to the first live
-- registered waiter, a fair one first (k.queue), then one waiting in mode
-- "notify" (k.handoff), or wakes one waiter of the shared list (those that
-- did not register: a multi-key lock's, or an older version's).
local function hand_next(k, now)
  local heir, hms, since = first_live(k.queue, k.hand, now)
  local popped = false
  if not heir then
    heir, hms, since = first_ready(k.handoff, now)
    popped = true
  end
  if heir then
    hand_to_heir(k, heir, hms, since, popped, now)
  else
    wake_one(k.signal)
  end
end
