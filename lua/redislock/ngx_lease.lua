-- SPDX-License-Identifier: MIT
--- redislock.ngx_lease: renewal under OpenResty, for redislock.ngx's node
-- leases (the interface is redislock/lease.lua's, which composes them).
--
-- One ngx.timer per worker renews the worker's leases over cosockets
-- (the C watchdog thread is for plain Lua; nginx workers are single-threaded),
-- those due together at once, in light threads. It only schedules and
-- moves bytes: when a renewal is due and what its answer means is the
-- core's lease machine (core.renewal, csrc/rl_renewal.c), the one the
-- watchdog thread drives; what a loss means for the hold, and what to do
-- with a lock whose request is gone, is its owner's (heard).
--
-- A lock with_lock took must not outlive the request's Lua thread that runs
-- fn. ngx.exit, ngx.exec and ngx.redirect end that thread without unwinding
-- (no pcall, no <close> runs), and ngx.thread.kill can end it too; the timer,
-- which belongs to the worker, would renew such a lock for ever. So with_lock's
-- lease comes with a sentinel: a light thread of fn's thread that waits on a
-- semaphore of its own. nginx ends every light thread of a request that is
-- left by ngx.exit/exec/redirect, which takes the sentinel off the semaphore;
-- the sentinel leaves by itself once fn's thread is dead (killed). Either way
-- the semaphore has no waiter any more, and the timer, at the lease's next
-- renewal, tells its owner ("abandoned"), which releases the lock, instead
-- of renewing it. with_lock kills the sentinel when it ends normally; a
-- stop from elsewhere (the timer found the lock lost) wakes it to leave, so
-- that it never keeps the request open after fn's thread: once that thread
-- ended, coroutine.status of it cannot be trusted (ngx_lua gives the
-- coroutine of a thread that ended to the worker's next thread, whose
-- status it then tells), and a sentinel left waiting on it kept its
-- request open while the coroutine served others (make torture's Redlock
-- hang). Only a killed fn thread is left to that status, which ngx_lua
-- never gives to another thread (see sentinel below). (The bottom of the
-- thread's stack is no better: a tail call changes it while fn runs.)
-- A sentinel is only ever touched while it waits: one that no longer does
-- may belong to a request nginx has freed.

local core = require("redislock.core")

local ngx = ngx
local ipairs, pairs, pcall, setmetatable, tostring = ipairs, pairs, pcall, setmetatable, tostring
local co_running, co_status = coroutine.running, coroutine.status
local debug_getinfo = debug.getinfo
local get_phase = ngx.get_phase
local timer_at, ngx_log, ERR = ngx.timer.at, ngx.log, ngx.ERR
local spawn, kill, wait = ngx.thread.spawn, ngx.thread.kill, ngx.thread.wait
local math_max = math.max
local new_renewal = core.renewal

local _M = { _VERSION = core._VERSION }

local semaphore -- ngx.semaphore (lua-resty-core), loaded on first use

-- How often the sentinel looks whether fn's thread was killed (seconds).
local SENTINEL_STEP = 1

-- Whether the running coroutine is one that nginx ends with the request: a
-- handler's entry thread or a light thread. A light thread spawned from a
-- coroutine the code made itself (coroutine.create) would, if that coroutine
-- were dropped while suspended, keep the request open for ever: nginx waits
-- for it. Timers are left out (their entry thread cannot be told apart).
local function request_thread()
  if get_phase() == "timer" then return false end
  local _, why = kill(co_running())
  if why == "killer not parent" then return true end -- a light thread
  -- A handler's entry thread has the handler's chunk at the bottom of its stack.
  local level, what = 2, nil
  while true do
    local info = debug_getinfo(level, "S")
    if not info then break end
    what, level = info.what, level + 1
  end
  return what == "main"
end

-- The sentinel's body: waits until fn's thread (owner) is dead, or the
-- hold's leases were stopped (watch.ended), or nginx ends it with the request.
-- watch: { sema, thread (the sentinel), ended }, shared by the node leases
-- of one hold.
--
-- Why the status of a killed owner stays "dead" (lua-nginx-module's src/,
-- lines of 0.10.23; unchanged in 0.10.31): coroutine.status is ngx_lua's,
-- the state of the co ctx attached to the coroutine (coroutine.c:397,
-- util.c:3139), which ngx.thread.kill sets dead (uthread.c:267 calls
-- util.c:436's del_thread). A coroutine goes to another thread only from
-- ngx_lua's cache, and only del_thread puts one there (util.c:458-473):
-- the coroutine the request's handler began on, deleted with the VM's
-- state as L, as run_thread does for a thread that ended by itself
-- (util.c:1371 to 1567); kill passes the killer's coroutine instead, and
-- unrefs the killed one (timers cache only their own, util.h:577).
-- Each new thread gets a new co ctx (coroutine.c:136), and the sentinel
-- holds owner, so it is not collected either. spec/57 kills an fn thread
-- that runs on its handler's coroutine, the kind ngx_lua reuses. A killed
-- thread's frames stay on its coroutine: no look at its stack could
-- tell that it was killed.
local function sentinel(watch, owner)
  local sema = watch.sema
  repeat sema:wait(SENTINEL_STEP) until watch.ended or co_status(owner) == "dead"
end

-- Whether the sentinel of watch waits (else it is gone, with its request
-- thread or because its hold's leases were stopped).
local function waits(watch)
  return watch.sema:count() < 0
end

-- Whether the request thread behind a lease's sentinel is gone.
local function gone_thread(lease)
  return lease.watch ~= nil and not waits(lease.watch)
end

-- Leases being renewed, weakly: a lease whose lock was garbage-collected
-- drops out, and is no longer renewed.
local leases = setmetatable({}, { __mode = "k" })
local timer_due -- when the pending timer fires (core.now seconds), or nil
local timer_gen = 0 -- the pending timer's number: an earlier one, replaced, does nothing
local ticking = false -- a tick is running: it schedules the next one itself

local Lease = {}
local lease_mt = { __index = Lease }

local schedule

-- Tells lease's owner of event (heard(owner, event, why)); logs what it raised.
local function tell(lease, event, why)
  local heard = lease.heard
  if not heard then return end
  local ok, err = pcall(heard, lease.owner, event, why)
  if not ok then ngx_log(ERR, "redislock: on_lost raised: ", tostring(err)) end
end

-- Renews one lease (in the timer, so cosockets are allowed).
local function renew(lease)
  local r = lease.r
  local ttl = r:sent()
  lease.busy = true
  -- An eval that raises must still answer the machine: else the lease
  -- would wait for this renewal for ever.
  local ok, status, value = pcall(lease.transport.eval, lease.transport, lease.extend, lease.key, lease.token, ttl)
  if not ok then status, value = nil, "connection: " .. tostring(status) end
  lease.busy = nil
  local outcome, why = r:answer(status, value)
  if leases[lease] == nil then return end -- stopped meanwhile
  if outcome == "retry" then
    tell(lease, "renew_failed", why)
  elseif outcome == "lost" then
    leases[lease] = nil
    tell(lease, "lost", why)
  end
end

-- A timer's: tells the owner of a lease whose request ended inside
-- with_lock ("abandoned"; premature: the worker is exiting), which releases
-- its lock.
local function abandoned(premature, lease)
  local ok, done, err = pcall(lease.heard, lease.owner, "abandoned", premature)
  if not (ok and done) then
    ngx_log(ERR, "redislock: cannot release a lock whose request ended inside with_lock (it runs out by its TTL): ",
            tostring(ok and err or done))
  end
end

-- The timer: renews what is due, then schedules the next run.
local function tick(premature, gen)
  if not premature and gen ~= timer_gen then return end -- replaced by an earlier one (schedule)
  timer_due = nil
  if premature then
    -- The worker is exiting (reload, stop): no timer runs any more, so the
    -- leases end here and run out by their TTL (check() says so then).
    for lease in pairs(leases) do
      lease.r:stop()
      leases[lease] = nil
    end
    return
  end
  ticking = true
  local due, gone, threads = {}, {}, {}
  for lease in pairs(leases) do
    local what = lease.r:next()
    if what == "now" then
      due[#due + 1] = lease
    elseif what == nil then
      local state, why = lease.r:state()
      if state ~= "held" then leases[lease] = nil end -- ended by max_hold
      if state == "lost" then tell(lease, "lost", why) end -- a delayed lease's TTL ran out before it was due
    end
  end
  -- A lease stopped while an earlier one was renewed is left alone: its
  -- lock may have been handed down to another request, token and all
  -- (redislock/ngx_gate.lua). Several due: at once, each in a light thread.
  for _, lease in ipairs(due) do
    if leases[lease] ~= nil then
      if gone_thread(lease) then
        gone[#gone + 1] = lease
      elseif #due == 1 then
        renew(lease)
      else
        threads[#threads + 1] = spawn(renew, lease)
      end
    end
  end
  for _, th in ipairs(threads) do wait(th) end
  for _, lease in ipairs(gone) do
    -- Its request's thread ended without unwinding: its owner gives the
    -- lock back, in a timer of its own (a refusal that passes is tried
    -- again meanwhile).
    if leases[lease] ~= nil then
      -- The node leases of one hold share its sentinel: one timer gives
      -- the lock back for all of them.
      lease.watch.thread = nil
      for other in pairs(leases) do
        if other.watch == lease.watch then
          leases[other] = nil
          other.r:stop()
        end
      end
      local ok, err = timer_at(0, abandoned, lease)
      if not ok then
        ngx_log(ERR, "redislock: cannot start a timer to release a lock (it runs out by its TTL): ", err)
      end
    end
  end
  ticking = false
  schedule()
end

-- Makes sure a timer fires by the earliest due renewal.
schedule = function()
  if ticking then return end -- the running tick schedules when it is done
  local first
  for lease in pairs(leases) do
    local due = lease.r:due()
    if not first or due < first then first = due end
  end
  if not first or (timer_due and timer_due <= first) then return end
  local delay = math_max(first - core.now(), 0.001)
  local ok, err = timer_at(delay, tick, timer_gen + 1)
  if ok then
    timer_gen, timer_due = timer_gen + 1, first
  else
    ngx_log(ERR, "redislock: cannot start the renewal timer: ", err)
  end
end

--- start(t, key, token, ttl_ms[, opts]) -> a node lease (redislock/lease.lua's
-- interface: state, extended, expires, due_now, stop; notifies), renewed by
-- this worker's timer over opts.via or else node transport t (its eval).
-- opts: max_hold_ms (> 0: the renewals end that long from now); sent_ms:
-- when the acquire was sent (core.now() * 1000); scoped: the lock must not
-- outlive the running request thread (with_lock): it gets a sentinel (see
-- above) when that thread is one nginx ends with the request; watch: the
-- lease.watch of another node lease of the same hold, whose sentinel this
-- one shares instead (the lease's own is lease.watch). heard(owner,
-- ...) is called (in the timer) with "lost", why when the machine finds the
-- lock lost, "renew_failed", err when a renewal failed and will be tried
-- again, and "abandoned" (see above). delay_ms: the lock delay, which each
-- renewal adds on the server (a renewal not sent, or not answered, before
-- the TTL ran out loses the lease instead: the core's rl_renewal_delay).
-- op: the script that renews it ("extend", the default, or a permit's or
-- read-write hold's "sem_extend" ...).
function _M.start(t, key, token, ttl_ms, opts)
  opts = opts or {}
  local lease = setmetatable({
    node = t, transport = opts.via or t, key = key, token = token, extend = opts.op or "extend",
    r = new_renewal(ttl_ms, opts), owner = opts.owner, heard = opts.heard,
  }, lease_mt)
  if opts.watch then -- another node lease's sentinel, of the same hold (redislock/lease.lua's compose)
    lease.watch = opts.watch
  elseif opts.scoped and request_thread() then
    semaphore = semaphore or require("ngx.semaphore")
    local watch = { sema = semaphore.new(0) }
    watch.thread = spawn(sentinel, watch, co_running()) -- waits at once: spawn returns then
    lease.watch = watch
  end
  leases[lease] = true
  schedule()
  return lease
end

--- moved(t): node transport t now points at another node (a Sentinel switch:
-- redislock/ngx.lua's retarget). The leases on it are renewed there at
-- once: renewals sent to the old master after the promotion and before the
-- switch was heard never reached the new one, where the lock keeps only
-- the TTL of the last renewal that was replicated before the promotion.
function _M.moved(t)
  local any = false
  for lease in pairs(leases) do
    if lease.node == t then
      lease.r:moved()
      any = true
    end
  end
  if any then schedule() end
end

--- "held" | "ended" | "lost", why
function Lease:state()
  return self.r:state()
end

--- The owner extended the lock to ttl_ms with a command sent at sent_ms:
-- renew to that from then on.
function Lease:extended(ttl_ms, sent_ms)
  self.r:extended(ttl_ms, sent_ms)
  if leases[self] then schedule() end
end

--- Whether a renewal is on its way now, or due (also: at once, after a
-- Sentinel switch).
function Lease:due_now()
  return self.r:due_now()
end

--- The latest time (core.now()) the lock lasts to without another renewal.
function Lease:expires()
  return self.r:expires()
end

--- No more renewals; ends the sentinel, if any: killed when called from
-- the thread that made it (with_lock's), else (the timer found the lock
-- lost; a lease of several nodes, stopped once for all) woken to leave by
-- itself, so that it does not keep the request open after fn's thread
-- ended. Returns what expires() says, and false when a renewal is on its
-- way (it may land after what is sent next: this driver cannot wait for it).
function Lease:stop()
  self.r:stop()
  leases[self] = nil
  local watch = self.watch
  if watch and not watch.ended then
    watch.ended = true
    if watch.thread and waits(watch) and not kill(watch.thread) then watch.sema:post(1) end
    watch.thread = nil
  end
  return self:expires(), not self.busy
end

--- This driver tells its owner (heard) of what it finds.
Lease.notifies = true

return _M
