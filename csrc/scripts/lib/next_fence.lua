-- SPDX-License-Identifier: MIT
--! include whole
-- next_fence(rec) -> the next fence of the slot whose fence record is rec
-- (README.md, "Fences"): the server's clock (TIME) in ms times
-- RL_FENCE_SCALE, or one above the last fence the record holds when that
-- is as high (more than RL_FENCE_SCALE fences in one ms, or a record
-- raised by a clock ahead of this one). The record keeps it. A record of an
-- earlier version ("<master ID> <offset>") is no number: every fence of
-- that version is below the clock's.
local function next_fence(rec)
  local t = redis.call('TIME')
  local f = t[1] * (1000 * RL_FENCE_SCALE) + math.floor(t[2] / 1000) * RL_FENCE_SCALE
  local last = tonumber(redis.call('GET', rec))
  if last and last >= f then f = last + 1 end
  redis.call('SET', rec, whole(f))
  return f
end
