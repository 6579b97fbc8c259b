-- SPDX-License-Identifier: MIT
--- redislock.backoff: the pause between two tries, the one of every loop
-- that tries again (a waiter of a busy lock, a release or extend refused
-- for a passing state, Redlock's settling, an observer's reads): a step
-- that doubles from FIRST up to MAX seconds, each pause jittered (half the
-- step to all of it, from the OS's randomness) so that waiters that failed
-- together do not try again together.

local core = require "redislock.core"

local tonumber = tonumber
local math_max, math_min = math.max, math.min
local token = core.token

local _M = { _VERSION = core._VERSION }

--- The first step and the largest (seconds).
_M.FIRST, _M.MAX = 0.002, 0.128
local MAX = _M.MAX

--- backoff.sleep(sleep, step, room[, whole]) -> the next step | nil:
-- sleeps (with sleep: the transport's) step seconds, jittered, but not
-- over room seconds and at least 1 ms (nginx's timers have millisecond
-- resolution, and ngx.sleep(0) only yields); returns step doubled, at most
-- MAX. whole: a pause that would not end within room is not cut short but
-- skipped: nil, nothing slept.
function _M.sleep(sleep, step, room, whole)
  local pause = step * (0.5 + tonumber(token():sub(1, 6), 16) / 0x2000000)
  if pause >= room then
    if whole then return nil end
    pause = room
  end
  sleep(math_max(pause, 0.001))
  return math_min(step * 2, MAX)
end

return _M
