-- SPDX-License-Identifier: MIT
-- rw_left(readers, writer, v, s, now): for a writer's try that did not
-- take the write lock, the ms until it may change: the writer's PTTL (v:
-- its token), a stale handoff's claim time when sooner (s: stale's
-- answer), or the last reader's expiry.
local function rw_left(readers, writer, v, s, now)
  if v then
    local left = redis.call('PTTL', writer)
    if s and s > 0 and s < left then left = s end
    return left
  end
  return tonumber(redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')[2]) - now
end
