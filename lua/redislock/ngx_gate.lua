-- SPDX-License-Identifier: MIT
--- redislock.ngx_gate: the waiters of one nginx worker, coalesced. The
-- requests of a worker that wait for the same lock (or permit, or read or
-- write hold) queue here, on an ngx.semaphore, and only the one at the head
-- of the queue (the gate's representative) tries and waits on Redis for
-- them: one blocked connection per worker and key, however many requests
-- wait. When it leaves (it gave up, or took a permit or read hold), the next
-- in the queue becomes the representative and tries at once. Exclusion
-- stays Redis's alone: a gate only decides which request of the worker asks.
--
-- A lock (not a fair one) goes further, as the cohort locks of Dice, Marathe
-- and Shavit ("Lock Cohorting", PPoPP 2012) do: the request that took it
-- keeps the gate while it holds the lock, and its release hands the lock to
-- the next request in the queue without a word to Redis (hand), at most
-- COHORT times in a row; then it releases it on Redis, where the other
-- workers and machines wait, and leaves the gate. The request handed the
-- lock takes it over as it is, token, fence and TTL (its renewal extends
-- it), or on Redis with its own TTL (redislock/wait.lua).
--
-- A representative's request may end without leaving (the client went
-- away, ngx.exit from another light thread): it says before each step
-- how long the step may take (gate.due), and the next in the queue takes
-- its place once that time has passed. One that comes back late after all
-- finds its generation gone and leaves nothing.
--
-- It is the waiting strategy of OpenResty's runtime (redislock/ngx.lua's
-- runtime table; redislock/wait.lua's take asks it for a waiter, and takes
-- its steps, below).

local core = require("redislock.core")
local semaphore = require("ngx.semaphore")

local pairs, setmetatable = pairs, setmetatable
local math_huge, math_max, math_min = math.huge, math.max, math.min
local now, renewal_step = core.now, core.renewal_step

local _M = { _VERSION = core._VERSION }

local Gates = {}
local mt = { __index = Gates }

-- Seconds a representative has for its first step, before it said more.
local FIRST_DUE = 2

-- Gates made between two sweeps of the overdue ones.
local SWEEP = 256

-- Hand-downs of a lock in a row within a worker, before it goes back to
-- Redis (where other workers and machines wait for it).
local COHORT = 16

-- A representative blocks at most STEP seconds at a time, and the next in
-- its queue takes its place when it did not come back SLACK seconds (and
-- the client's timeouts) after its step should have ended: its request
-- ended without leaving. A holder is given its TTL and SLACK.
local STEP, SLACK = 1, 0.5

--- A client's gates: none yet.
function _M.new()
  return setmetatable({ by_name = {} }, mt)
end

-- Requests queued on gate g (the semaphore made when the first one queued).
local function queued(g)
  local sema = g.sema
  return sema ~= nil and sema:count() < 0
end

--- gates:sweep(): forgets every overdue gate nobody queues on (see find):
-- those of keys not waited for again.
function Gates:sweep()
  for name in pairs(self.by_name) do self:find(name) end
end

--- gates:find(name) -> the gate called name (what is waited for: the
-- primitive and its key), or nil when no request of this worker waits or
-- holds there. A gate nobody queues on whose holder is overdue (its request
-- ended inside with_lock, or it dropped its lock) is forgotten here.
function Gates:find(name)
  local g = self.by_name[name]
  if g and now() >= g.due and (g.sema == nil or g.sema:count() == 0) then
    self.by_name[name] = nil
    return nil
  end
  return g
end

--- gates:enter(name, deadline, value) -> gate, gen, handed | nil, gate:
-- makes the caller the representative of the gate called name: at once
-- when there is none (a new one, whose gate.value is value: what the
-- caller's last try answered), else once the requests before it left, or
-- the one before it is overdue; nil (and the gate, whose gate.value the
-- caller may report) when deadline (core.now() seconds) came first. gen:
-- what leave and hold must be given; handed: a lock handed down to the
-- caller (hand: { token, fence, expires }), which it takes over, or nil.
-- The representative keeps gate.due (core.now() seconds by which it leaves
-- or says more) and gate.value, gate.at (its last answer, and when) current.
function Gates:enter(name, deadline, value)
  local gates = self.by_name
  while true do
    local g = gates[name]
    if not g then
      local t = now()
      g = { gen = 0, due = t + FIRST_DUE, value = value, at = t, passes = 0 }
      gates[name] = g
      self.made = (self.made or 0) + 1
      if self.made % SWEEP == 0 then self:sweep() end
      return g, 0
    end
    local left = deadline - now()
    if left <= 0 then return nil, g end
    local sema = g.sema
    if not sema then
      sema = semaphore.new(0)
      g.sema = sema
    end
    local given = sema:wait(math_min(left, math_max(g.due - now(), 0.001)))
    -- A turn given as the wait ran out stays with the semaphore: take it.
    if not given and sema:count() > 0 then given = sema:wait(0) end
    if given then
      local handed = g.handed
      g.due, g.holding, g.handed = now() + FIRST_DUE, nil, nil
      return g, g.gen, handed
    end
    -- Timed out: at the deadline (the next turn returns), or the
    -- representative is overdue: its request ended without leaving.
    if gates[name] == g and now() >= g.due then
      g.gen = g.gen + 1
      g.due = now() + FIRST_DUE
      g.holding, g.holder, g.handed = nil, nil, nil
      return g, g.gen
    end
  end
end

--- gates:leave(name, gate, gen[, cohort]): the representative (or the
-- holder, whose cohort record is then given) leaves; the next request in the
-- queue, if any, becomes the representative. Nothing when gen is no longer
-- the gate's (another took its place), or the holder left or handed the lock
-- down already (through another object of the same lock: with_lock's
-- stand-in, redislock/lock.lua's note).
function Gates:leave(name, g, gen, cohort)
  local gates = self.by_name
  if cohort then
    if cohort.done then return end
    cohort.done = true
  end
  if gates[name] ~= g or g.gen ~= gen then return end
  g.holding, g.holder, g.passes = nil, nil, 0
  if queued(g) then
    g.due = now() + FIRST_DUE
    g.sema:post(1)
  else
    gates[name] = nil
  end
end

--- gates:hold(name, gate, gen, until_s, handed, ttl_ms) -> a cohort record |
-- nil: the representative took a lock (handed: the one handed down to it;
-- ttl_ms: its TTL) and keeps the gate while it holds it, until until_s
-- (core.now() seconds, math.huge while its renewal runs: after that the next
-- in the queue may take its place, and wait on Redis). The record
-- goes with the lock, for hand and done: { gates, name, gate, gen, done };
-- nil when another request took the caller's place meanwhile.
function Gates:hold(name, g, gen, until_s, handed, ttl_ms)
  if self.by_name[name] ~= g or g.gen ~= gen then return nil end -- another took its place
  g.holding, g.due = true, until_s
  g.value, g.at = ttl_ms, now() -- for the busy answer of a request that gives up behind it
  if not handed then g.passes = 0 end
  return { gates = self, name = name, gate = g, gen = gen }
end

--- gates:keep(cohort, lock): the gate keeps the holder's lock object (and
-- so its renewal) alive while it holds the gate: when its request ends
-- inside with_lock the renewal timer must find it to release the lock and
-- let the queue go on (redislock/ngx_lease.lua), not the garbage collector.
function Gates:keep(cohort, lock)
  if self.by_name[cohort.name] == cohort.gate then cohort.gate.holder = lock end
end

--- gates:lost(cohort): the holder's lock was found lost; the next in the
-- queue may take its place soon, should the holder not come back.
function Gates:lost(cohort)
  local g = cohort.gate
  if not cohort.done and self.by_name[cohort.name] == g and g.gen == cohort.gen then
    g.due = math_min(g.due, now() + FIRST_DUE)
  end
end

--- gates:done(cohort): the holder of a cohort record released its lock on
-- Redis, or its request ended: it leaves the gate (once).
function Gates:done(cohort)
  self:leave(cohort.name, cohort.gate, cohort.gen, cohort)
end

--- gates:hand(cohort, lock) -> true | false: hands the lock that the
-- cohort record's holder releases (lock: { token, fence, expires }, expires:
-- core.now() seconds before which it cannot have expired) to the first
-- request in the queue, which takes it over; false (nothing done) when none
-- waits, the lock was handed down COHORT times in a row already, or the gate
-- is no longer the holder's.
function Gates:hand(cohort, lock)
  local g = cohort.gate
  if cohort.done or self.by_name[cohort.name] ~= g or g.gen ~= cohort.gen or not g.holding or g.passes >= COHORT
     or not queued(g) then
    return false
  end
  cohort.done, g.holder = true, nil
  g.passes = g.passes + 1
  g.handed, g.due = lock, now() + FIRST_DUE
  g.sema:post(1)
  return true
end

-- A take's waiter (Gates:waiter): { gates, name, cohort (with_lock may
-- keep the gate while it holds, and be handed the lock), try_s (how long
-- one try may take), c and key (to give a handed lock back), gate, gen
-- (once in), given (a lock handed down to it, until it is taken over) }.
local Waiter = {}
local waiter_mt = { __index = Waiter }

--- gates:waiter(client, key, how, kind) -> waiter | nil: the steps of a
-- take that waits (redislock/wait.lua's take: kind and how are its) through
-- the gate of what it takes: each primitive and key has its own; none for a
-- multi-key lock (kind.eval), whose key changes. A lock (kind.cohort, not a
-- fair one) that with_lock takes (how.scoped) keeps its gate and may be
-- handed down within the worker (a cohort, under a name of its own); not
-- one from acquire, which may be released elsewhere (another request,
-- from_token) unheard by the gate.
function Gates:waiter(client, key, how, kind)
  if kind.eval then return nil end
  local cohort = kind.cohort and not how.fair and how.scoped
  local link = client._link
  return setmetatable({ gates = self, cohort = cohort, c = client._transport, key = key,
                        name = (cohort and "cohort" or kind.wait or "lock") .. "/" .. (kind.n or "") .. "/" .. key,
                        try_s = 2 * (link.timeout + link.connect_timeout) + SLACK }, waiter_mt)
end

-- Whether w still is its gate's representative (none took its place).
local function in_gate(w)
  local g = w.gate
  return g ~= nil and g.gen == w.gen and w.gates:find(w.name) == g
end

-- Says when w's representative will be back from a step: by t (core.now()).
local function due(w, t)
  if in_gate(w) then w.gate.due = t end
end

-- How long a holder keeps w's gate before the next in its queue may take
-- its place (and wait on Redis): while its renewal runs, until the gate is
-- left (its release, or its renewal timer's when its request ended; a lost
-- renewal cuts it short, see gates:lost); else for its TTL, or its
-- max_hold and TTL, and SLACK.
local function held_until(how, ms)
  if how.renew and not how.max_hold_ms then return math_huge end
  return now() + ((how.max_hold_ms or 0) + ms) / 1000 + SLACK
end

--- waiter:queued(): whether other requests of the worker wait or hold there.
function Waiter:queued()
  return self.gates:find(self.name) ~= nil
end

--- waiter:enter(deadline[, value]) -> true | false, news: enters the gate
-- (at once when none, else behind the requests there) by deadline; value:
-- what the caller's last try answered, if any. news: what the gate's
-- representative last heard, aged since, for the busy answer.
function Waiter:enter(deadline, value)
  local g, gen, handed = self.gates:enter(self.name, deadline, value)
  if not g then
    local v = gen.value or 0
    if v > 0 then v = math_max(0, v - (now() - gen.at) * 1000) end
    return false, v
  end
  self.gate, self.gen, self.given = g, gen, handed
  return true
end

--- waiter:noted(value) -> whether it entered already: the representative
-- keeps what its last try answered (value) for those behind it.
function Waiter:noted(value)
  if not self.gate then return false end
  if in_gate(self) then self.gate.value, self.gate.at = value, now() end
  return true
end

--- waiter:trying(t): a try is sent at t (core.now()).
function Waiter:trying(t)
  due(self, t + self.try_s)
end

--- waiter:blocking(s) -> seconds: a representative blocks STEP at most at
-- a time, and says when it will be back.
function Waiter:blocking(s)
  if not self.gate then return s end
  s = math_min(s, STEP)
  due(self, now() + s + self.try_s)
  return s
end

--- waiter:handed(how, ms) -> token, fence, cohort | nil: a lock handed down
-- to it (hand), to be taken with its token; taken over as it is (its
-- fence, and the cohort record) when its renewal (how.renew) can extend it
-- in time (what is left of it spans a renewal's step: core.renewal_step);
-- else the acquire script takes it over with this request's TTL (ms),
-- finding its token there.
function Waiter:handed(how, ms)
  local handed = self.given
  if not handed then return nil end
  if not how.renew or how.replicas or (handed.expires - now()) * 1000 < renewal_step(ms) then return handed.token end
  local cohort = self.gates:hold(self.name, self.gate, self.gen, held_until(how, ms), true, ms)
  if not cohort then return handed.token end
  self.given, cohort.expires = nil, handed.expires
  return handed.token, handed.fence, cohort
end

--- waiter:drop() -> true when a lock was handed down to it (a try found it
-- gone, or another's): forgotten.
function Waiter:drop()
  if not self.given then return false end
  self.given = nil
  return true
end

--- waiter:pending(): whether a lock handed down waits to be taken over.
function Waiter:pending()
  return self.given ~= nil
end

--- waiter:quit(): leaves the gate, if in it.
function Waiter:quit()
  if self.gate then self.gates:leave(self.name, self.gate, self.gen) end
end

--- waiter:took(how, ms, deadline) -> cohort | nil: the take succeeded. A
-- cohort's holder keeps the gate (entering it when nobody waits there):
-- its record (hold); others leave it.
function Waiter:took(how, ms, deadline)
  if self.cohort then
    if not self.gate and not self.gates:find(self.name) then self:enter(deadline) end -- taken at once
    local cohort = self.gate and self.gates:hold(self.name, self.gate, self.gen, held_until(how, ms), self.given, ms)
    if cohort then return cohort end
  end
  self:quit()
end

--- waiter:give_up(token): the take gave up; a lock handed down and not taken
-- over goes back to Redis (best effort, held with token), and it leaves.
function Waiter:give_up(token)
  if self.given then self.c:eval("release", self.key, token) end
  self:quit()
end

return _M
