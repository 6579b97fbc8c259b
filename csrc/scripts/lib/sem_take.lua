-- SPDX-License-Identifier: MIT
--! include fence_of sem_handed_fence whole zset_expire
-- sem_take(permits, fence, era, token, ttl, limit, now): a semaphore's try,
-- expired permits already dropped. A token that holds a permit already (a
-- resend, or a permit handed to it whose wake-up it did not wait for) keeps
-- it; else it takes one when fewer than limit are held. Its permit then
-- lasts ttl (ms) from now, and it gets its fence: a handoff's, or the slot's
-- next. nil when no permit is free.
local function sem_take(permits, fence, era, token, ttl, limit, now)
  local resent = redis.call('ZSCORE', permits, token)
  if not resent and redis.call('ZCARD', permits) >= tonumber(limit) then return nil end
  redis.call('ZADD', permits, whole(now + tonumber(ttl)), token)
  zset_expire(permits, now)
  return resent and sem_handed_fence(permits, token) or fence_of(fence, era)
end
