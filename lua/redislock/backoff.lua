-- SPDX-License-Identifier: MIT
--- redislock.backoff: the pause between two tries, the one of every loop
-- that tries again (a waiter of a busy lock, a release or extend refused
-- for a passing state, Redlock's settling, an observer's reads): a step
-- that doubles from FIRST up to MAX seconds, each pause jittered (half the
-- step to all of it, from the OS's randomness) so that waiters that failed
-- together do not try again together.

local core = require("redislock.core")
local errors = require("redislock.errors")

local tonumber = tonumber
local math_max, math_min = math.max, math.min
local token, now, retry = core.token, core.now, errors.retry

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


--- passing(err): whether err (an error message) says the command did not
-- run, for a state that passes (a restart loading its data, a busy script,
-- a master demoted or down, a cluster slot moving or a cluster without a
-- master: redislock/errors.lua's "again"). Unlike a reply lost on a broken
-- connection (the command may have run: a release sent again could then
-- say "lost"), such a refusal may be followed by the same command.
local function passing(err)
  return retry(err, "again")
end
_M.passing = passing

--- again_from(a, b, ...): again's loop, from what its first t:eval
-- answered (redislock/lock.lua sends that first try itself).
local function again_from(a, b, sleep, deadline, t, op, key, tok, ms)
  local step = _M.FIRST
  while a == nil and passing(b) do
    step = _M.sleep(sleep, step, deadline - now(), true)
    if not step then break end
    a, b = t:eval(op, key, tok, ms)
  end
  return a, b
end
_M.again_from = again_from

--- again(sleep, deadline, t, op, key, tok[, ms]) -> what t:eval returned:
-- runs t:eval(op, key, tok, ms); while its first value is nil and its
-- second a refusal for a passing state, runs it again after the pause
-- above, as long as that pause ends before deadline (core.now() seconds);
-- sleep is the transport's. (No closure: a release runs it on every
-- call.) A transport over several servers does this per server: its
-- t:eval_until.
function _M.again(sleep, deadline, t, op, key, tok, ms)
  if t.eval_until then return t:eval_until(deadline, op, key, tok, ms) end
  local a, b = t:eval(op, key, tok, ms)
  return again_from(a, b, sleep, deadline, t, op, key, tok, ms)
end

return _M
