-- SPDX-License-Identifier: MIT
--! include next_fence
-- fence_of(legacy, rec): the fence of a new holder of a sorted set by
-- expiry (semaphore permits, readers), or of a writer, also a resend's
-- (its answer was lost: nobody saw its fence): the slot's next. legacy is
-- the counter an earlier version kept per name: it goes.
local function fence_of(legacy, rec)
  redis.call('DEL', legacy)
  return next_fence(rec)
end
