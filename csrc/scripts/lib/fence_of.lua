-- SPDX-License-Identifier: MIT
--! include era
-- fence_of(fence, rec, resent): the fence of a holder of a sorted set by
-- expiry (semaphore permits, readers), or of a writer: a resend's that
-- found its token (resent true), else the next one, in this master's era.
local function fence_of(fence, rec, resent)
  if resent then
    local f = tonumber(redis.call('GET', fence))
    if f and f >= 1 then return f + era(rec) end
  end
  return redis.call('INCR', fence) + era(rec)
end
