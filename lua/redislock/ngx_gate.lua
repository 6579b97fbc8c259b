-- SPDX-License-Identifier: MIT
--- redislock.ngx_gate: the waiters of one nginx worker, coalesced. The
-- requests of a worker that wait for the same lock (or permit, or read or
-- write hold) queue here, on an ngx.semaphore, and only the one at the head
-- of the queue (the gate's representative) tries and waits on Redis for
-- them: one blocked connection per worker and key, however many requests
-- wait. When it leaves (it took the lock, or gave up), the next in the
-- queue becomes the representative and tries at once. Exclusion stays
-- Redis's alone: a gate only decides which request of the worker asks.
--
-- A representative's request may end without leaving (the client went
-- away, ngx.exit from another light thread): it says before each step
-- how long the step may take (gate.due), and the next in the queue takes
-- its place once that time has passed. One that comes back late after all
-- finds its generation gone and leaves nothing.

local core = require "redislock.core"
local semaphore = require "ngx.semaphore"

local setmetatable = setmetatable
local math_max, math_min = math.max, math.min
local now = core.now

local _M = { _VERSION = core._VERSION }

local Gates = {}
local mt = { __index = Gates }

-- Seconds a representative has for its first step, before it said more.
local FIRST_DUE = 2

--- A client's gates: none yet.
function _M.new()
  return setmetatable({ by_name = {} }, mt)
end

--- gates:find(name) -> the gate called name (what is waited for: the
-- primitive and its key), or nil when no request of this worker waits there.
function Gates:find(name)
  return self.by_name[name]
end

--- gates:enter(name, deadline, value) -> gate, gen | nil, gate: makes the
-- caller the representative of the gate called name: at once when there is
-- none (a new one, whose gate.value is value: what the caller's last try
-- answered), else once the requests before it left, or the one before it is
-- overdue; nil (and the gate, whose gate.value the caller may report) when
-- deadline (core.now() seconds) came first. gen: what leave must be given.
-- The representative keeps gate.due (core.now() seconds by which it leaves
-- or says more) and gate.value, gate.at (its last answer, and when) current.
function Gates:enter(name, deadline, value)
  local gates = self.by_name
  while true do
    local g = gates[name]
    if not g then
      local t = now()
      g = { sema = semaphore.new(0), gen = 0, due = t + FIRST_DUE, value = value, at = t }
      gates[name] = g
      return g, 0
    end
    local left = deadline - now()
    if left <= 0 then return nil, g end
    local ok = g.sema:wait(math_min(left, math_max(g.due - now(), 0.001)))
    if ok then
      g.due = now() + FIRST_DUE
      return g, g.gen
    end
    -- Timed out: at the deadline (the next turn returns), or the
    -- representative is overdue: its request ended without leaving.
    if gates[name] == g and now() >= g.due then
      g.gen = g.gen + 1
      g.due = now() + FIRST_DUE
      return g, g.gen
    end
  end
end

--- gates:leave(name, gate, gen): the representative leaves; the next
-- request in the queue, if any, becomes it. Nothing when gen is no longer
-- the gate's (another took its place).
function Gates:leave(name, g, gen)
  local gates = self.by_name
  if gates[name] ~= g or g.gen ~= gen then return end
  if g.sema:count() < 0 then -- requests wait on it
    g.due = now() + FIRST_DUE
    g.sema:post(1)
  else
    gates[name] = nil
  end
end

return _M
