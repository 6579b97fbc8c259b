-- SPDX-License-Identifier: MIT
--! include next_fence whole
-- grant(fence, rec, ms) -> the fence of a lock just taken (or handed over,
-- or taken again by a resend: its answer was lost, so nobody saw its
-- fence): the slot's next (next_fence), kept in fence, the holder's fence,
-- for ms, as long as the lock (lock_state reads it: an election's term).
-- It replaces a counter an earlier version left there.
local function grant(fence, rec, ms)
  local f = next_fence(rec)
  redis.call('SET', fence, whole(f), 'PX', ms)
  return f
end
