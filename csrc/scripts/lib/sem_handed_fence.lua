-- SPDX-License-Identifier: MIT
--! include list
-- sem_handed_fence(permits, token): in a try that found the permit its own
-- (resent), the fence of a handoff whose wake-up it did not wait for,
-- which is its fence, or nil; its wake-up list is emptied either way.
local function sem_handed_fence(permits, token)
  local own = permits .. ':signal:' .. token
  local e = list('LINDEX', own, -1)
  list('DEL', own)
  return e and tonumber(string.match(e, '^(%d+) '))
end
