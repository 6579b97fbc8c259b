-- SPDX-License-Identifier: MIT
--! include first_live first_ready hand_to_heir wake_one
-- hand_next(lock, signal, queue, hand, fence, rec, handoff, now) ->
-- handed: with the lock free (its names as hand_to_heir's, and its handoff
-- set), hands it to the first live registered waiter, a fair one first
-- (queue), then one waiting in mode "notify" (handoff), or wakes one waiter
-- of the shared list (those that did not register: a multi-key lock's, or
-- an older version's).
local function hand_next(lock, signal, queue, hand, fence, rec, handoff, now)
  local heir, hms, since = first_live(queue, hand, now)
  local popped = false
  if not heir then
    heir, hms, since = first_ready(handoff, now)
    popped = true
  end
  if heir then return hand_to_heir(lock, signal, queue, hand, fence, rec, heir, hms, since, popped, now) end
  wake_one(signal)
  return false
end
