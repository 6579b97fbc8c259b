-- SPDX-License-Identifier: MIT
--- redislock.lease: a hold's lease, composed of its nodes' leases, and the
-- one place a loss is reported to the lock and the observer.
--
-- A node lease renews one lock on one node; the core's lease machine
-- (csrc/rl_renewal.c) decides when and what each answer means, and one of
-- two drivers moves the time and bytes: the watchdog thread in plain Lua
-- (client:lease, csrc/rl_lua_lease.c) or the worker's timer under
-- OpenResty (redislock/ngx_lease.lua). Both present one interface:
--
--   node:lease(key, token, ttl_ms, opts) -> node lease | nil, err; opts:
--        max_hold_ms, sent_ms (core.now() ms when the acquire was sent),
--        delay_ms, op (the script that renews: "extend", "sem_extend" ...),
--        and for a driver in this Lua state: via (the transport its
--        renewals go through, the node's by default: a cluster's follows
--        redirects; the watchdog follows them itself), scoped (with_lock's:
--        the lock must not outlive the request thread), and heard and
--        owner: heard(owner, event, why) tells the owner (the lock) of news
--   l:state() -> "held" | "ended" | "lost", why   l:expires() -> seconds
--   l:extended(ttl_ms, sent_ms)   l:due_now()
--   l:stop([settle]) -> what expires() said, answered (false: a renewal
--        was on its way and not answered; settle waits for it to end)
--   l.notifies        true when its driver calls heard itself:
--        "lost" (why), "renew_failed" (why), "abandoned" (the request
--        thread of a scoped lease ended; why: the worker is exiting)
--
-- The state is always polled (lock:check, with_lock's hook); a driver that
-- runs in this Lua state also tells, and the lock then needs no hook.
-- A hold's lease is held while `quorum` of its node leases are: 1 for one
-- server, Sentinel and Cluster (the node lease itself is then the hold's),
-- a majority for Redlock, whose expiry is the quorum-th latest less its
-- drift (a Lease below, with the same interface). A topology names the
-- nodes with t:lease_nodes(key, token) -> nodes, quorum, drift(ms), via; a
-- node transport (no lease_nodes) is its own one node.

local backoff = require("redislock.backoff")
local core = require("redislock.core")

local ipairs, setmetatable, string_format, table_sort = ipairs, setmetatable, string.format, table.sort
local math_ceil, math_floor, math_huge, math_max, math_min = math.ceil, math.floor, math.huge, math.max, math.min
local now = core.now

local _M = { _VERSION = core._VERSION }

-- redislock.lock, which requires this module and binds itself here: the
-- lease tells the lock through it.
local lock_mod
function _M.bind(m) lock_mod = m end

local Lease = {}
local lease_mt = { __index = Lease }

-- What a lock's lease says of it, for redislock/lock.lua.

--- stop(lock[, settle]) -> at, answered: stops the lock's renewal, if
-- any, keeping in lock._expires when it runs out by the last renewal; the
-- lease's stop (at: its expiry, answered: false when a renewal on its way
-- was not answered; settle: waits for it to end).
function _M.stop(lock, settle)
  local lease = lock._lease
  if not lease then return end
  local at, answered = lease:stop(settle)
  lock._expires = at or lock._expires
  return at, answered
end

--- The latest time (core.now()) lock may last to, or nil when unknown.
function _M.expires(lock)
  local lease = lock._lease
  return lease and lease:expires() or lock._expires
end

--- Whether lock's lease found it lost and nobody was told yet.
function _M.lost_news(lock)
  return lock._state == "held" and lock._lease ~= nil and lock._lease:state() == "lost"
end

--- extended(lock, ms, sent): lock was extended to ms by a command sent at
-- sent (core.now()): it lasts that long from then (a Redlock's validity:
-- less its drift), and its lease renews to that from then on.
function _M.extended(lock, ms, sent)
  local t, lease = lock._t, lock._lease
  lock._expires = sent + (t.validity_ms and t:validity_ms(ms) or ms) / 1000
  if lease then
    lock._renew_ms = ms
    lease:extended(ms, math_floor(sent * 1000))
  end
end

--- Whether lock is still ours by our own account and clock: not
-- released, not found lost, and its TTL cannot have run out.
function _M.ours_by_clock(lock)
  return lock ~= nil and lock._state == "held" and now() < (_M.expires(lock) or math_huge)
end

--- Whether lock ran out of TTL by now (it was told nothing): not renewed
-- (or no longer: max_hold), or, with a lock delay, renewed but not in
-- time (its process was paused): the server keeps it the delay longer,
-- but its holder must stop at its TTL.
function _M.ran_out(lock)
  local lease, at = lock._lease, _M.expires(lock)
  return at ~= nil and now() >= at and (not lease or lock._delay_ms ~= nil or lease:state() ~= "held")
end

--- "held" | "ended" | "lost", why: held while quorum node leases are.
function Lease:state()
  local nodes, quorum = self.nodes, self.quorum
  local held, why = 0, nil
  for _, l in ipairs(nodes) do
    local s, w = l:state()
    if s == "held" then
      held = held + 1
    elseif s == "lost" and not why then
      why = w
    end
  end
  if held >= quorum then return "held" end
  if why then
    return "lost", string_format("fewer than %d of %d Redlock servers still hold it; %s", quorum, #nodes, why)
  end
  return "ended"
end

--- The latest time (core.now()) the lock lasts to without another renewal
-- (nil when unknown): the quorum-th latest of the nodes', less the drift.
function Lease:expires()
  if self.stopped_at then return self.stopped_at end
  local at = {}
  for i, l in ipairs(self.nodes) do at[i] = l:expires() or 0 end
  table_sort(at, function(a, b) return a > b end)
  return at[self.quorum] - self.drift(self.ttl_ms) / 1000
end

--- The owner extended the lock to ttl_ms with a command sent at sent_ms.
function Lease:extended(ttl_ms, sent_ms)
  self.ttl_ms = ttl_ms
  for _, l in ipairs(self.nodes) do l:extended(ttl_ms, sent_ms) end
end

--- Whether a renewal is on its way now, or due.
function Lease:due_now()
  for _, l in ipairs(self.nodes) do
    if l:due_now() then return true end
  end
  return false
end

--- No more renewals: returns what expires() said, and false when a
-- renewal was on its way and not answered (settle: waits for it to end).
function Lease:stop(settle)
  if self.stopped_at then return self.stopped_at, true end
  local at, answered = self:expires(), true
  for _, l in ipairs(self.nodes) do
    local _, a = l:stop(settle)
    if a == false then answered = false end
  end
  -- A stopped node lease may know no expiry any more (the watchdog's):
  -- the hold's stays what it was.
  self.stopped_at = at
  return at, answered
end

-- heard(lock, event, why): what a node lease's driver tells (see above):
-- the one place a loss is told to the lock and the observer. Returns nil
-- and why when the lock of an abandoned lease could not be released.
local function heard(lock, event, why)
  local lease = lock._lease
  if event == "lost" then
    if lease:state() ~= "lost" then return true end -- a majority still holds it
    local cohort = lock._cohort
    if cohort then cohort.gates:lost(cohort) end
    lock_mod.lease_lost(lock)
  elseif event == "renew_failed" then
    lock_mod.observe(lock._link, event, { key = lock.key, kind = lock._ops.kind, why = why })
  elseif event == "abandoned" then
    -- Its request ended inside with_lock: given back (a refusal that passes
    -- is tried again while the lock lasts; once when the worker exits), and
    -- its worker's queue goes on.
    local at = lease:stop()
    local status, err = backoff.again(lock._link.sleep, why and 0 or at or 0, lock._t, lock._ops.release,
                                       lock.key, lock.token)
    local cohort = lock._cohort
    lock._cohort = nil
    if cohort then cohort.gates:done(cohort) end
    if status == nil then return nil, err end
  end
  return true
end

-- The lease of a lock over several nodes (see above), or nil and an error
-- (the leases made stopped again).
local function compose(nodes, quorum, drift, key, tok, ms, opts)
  local self = setmetatable({ nodes = {}, quorum = quorum, drift = drift, ttl_ms = ms }, lease_mt)
  for i, node in ipairs(nodes) do
    local l, err = node:lease(key, tok, ms, opts)
    if not l then
      for _, done in ipairs(self.nodes) do done:stop() end
      return nil, err
    end
    self.nodes[i] = l
    -- One sentinel watches the request thread for all: the others share
    -- what it signals (under OpenResty), so that whichever node lease is
    -- due finds the request gone, even once the first is lost.
    opts.scoped, opts.watch = nil, l.watch
  end
  self.notifies = self.nodes[1].notifies
  return self
end

--- start(lock, how, ms, sent): renews lock every ttl/3 from now on (how:
-- the renew options as args.lock_opts makes them; how.scoped: the lock
-- must not outlive the running thread, as with_lock's; ms its TTL; sent:
-- core.now() when the acquire was sent) and sets lock._lease,
-- lock._on_lost and lock._renew_ms (the TTL its renewals set). Raises when
-- renewal cannot start (the watchdog thread, or memory), after releasing
-- the lock.
function _M.start(lock, how, ms, sent)
  local t, key, tok = lock._t, lock.key, lock.token
  local opts = { max_hold_ms = how.max_hold_ms, sent_ms = math_floor(sent * 1000), scoped = how.scoped,
                 op = lock._ops.extend, delay_ms = how.delay_ms, owner = lock, heard = heard }
  local lease, err
  if t.lease_nodes then
    local nodes, quorum, drift, via = t:lease_nodes(key, tok)
    opts.via = via
    if #nodes == 1 then
      lease, err = nodes[1]:lease(key, tok, ms, opts)
    else
      lease, err = compose(nodes, quorum, drift, key, tok, ms, opts)
    end
  else
    lease, err = t:lease(key, tok, ms, opts)
  end
  _M.took(lock, lease, lease and ms or err, how.on_lost)
end

--- took(lock, lease, ms[, on_lost]): start's end, also for a lease made
-- in C (core.fast_with's: redislock/hold.lua's with_taken): lease and ms,
-- the TTL its renewals set, become lock._lease, lock._renew_ms (and
-- lock._on_lost); with lease nil (ms then why it could not start), the
-- lock is released and that raised.
function _M.took(lock, lease, ms, on_lost)
  if not lease then
    lock:release()
    error("redislock: " .. ms, 0)
  end
  lock._lease, lock._on_lost, lock._renew_ms = lease, on_lost, ms
end

--- Whether lock has a lease, an on_lost to call when it is lost, and node
-- leases whose driver does not tell (with_lock's hook then looks).
function _M.watchable(lock)
  local lease = lock._lease
  return lock._on_lost ~= nil and lease ~= nil and not lease.notifies
end

--- keep_until(hold, until_, sleep) -> true | nil, err: lets go of hold (a
-- lock, a permit) so that it lasts until until_ (core.now() seconds) and
-- then runs out by its TTL (redislock run --min-hold): its renewal stops,
-- one on its way is waited for, then one extend makes what is left its
-- TTL. A renewal that was on its way and never answered may still reach
-- the server (held up in the network, or unread) and set its TTL again
-- after that extend: then extends go on at the renewals' own step
-- (core.renewal_step) until what is left is within the renewals' TTL, so
-- that a renewal landing any later keeps it at least as long. Released at once when nothing is left.
function _M.keep_until(hold, until_, sleep)
  local function left() return math_ceil((until_ - now()) * 1000) / 1000 end
  if left() < 0.001 then return hold:release() end
  local ttl_ms = hold._renew_ms or 0
  local ttl = ttl_ms / 1000
  local _, answered = _M.stop(hold, true)
  local ok, err = hold:extend(left())
  if answered ~= false then return ok, err end
  local step = core.renewal_step(math_max(math_floor(ttl_ms), 1)) / 1000
  while ok and now() < until_ - ttl do
    sleep(math_min(step, until_ - ttl - now()))
    ok, err = hold:extend(left())
  end
  return ok, err
end

return _M
