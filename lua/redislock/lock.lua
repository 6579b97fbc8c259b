-- SPDX-License-Identifier: MIT

--- redislock.lock: the lock object (release, extend, ttl, check, <close>). A lock knows its key,
-- token, fence, transport and lease (redislock/lease.lua, which tells it of a loss); the server-side
-- work is one token-checked script per call. Primitives that hand out owned, expiring things build on `new`.

local args = require("redislock.args")
local backoff = require("redislock.backoff")
local core = require("redislock.core")
local errors = require("redislock.errors")
local lease_mod = require("redislock.lease")

local error, getmetatable, pcall, select, setmetatable, tostring, type =
      error, getmetatable, pcall, select, setmetatable, tostring, type
local string_format = string.format
local math_huge = math.huge
local now, MAX_MS = core.now, core.MAX_MS
local unanswered = errors.unanswered
local again, again_from = backoff.again, backoff.again_from
local quote, check_self, check_nargs, check_seconds, check_phase, argerror =
      args.quote, args.check_self, args.check_nargs, args.check_seconds, args.check_phase, args.argerror

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

--- A lock: what Client:acquire and Client:from_token return, and what
-- with_lock passes to its function. A semaphore's permit and a read-write
-- lock's holds are locks too. On Lua 5.4 a lock is a to-be-closed variable:
-- `local lock <close> = ...` releases it on every way out of the block.
-- @type Lock
-- @field key the lock's name, as given
-- @field token the owner token: 32 hex digits (128 random bits), then who
--   holds it, /host/pid/since[/label]
-- @field fence a number larger than every earlier holder's of this key
--   (nil for a lock made by from_token)
local Lock = {}
local lock_mt = { __index = Lock }
local fast_release, fast_leased = core.fast_release(lock_mt)

-- The scripts of a lock, and how messages name it. Other primitives' holds
-- (a semaphore's permit, a read-write lock's read or write hold) are lock
-- objects with scripts of their own: release, extend, pttl (each checks the
-- token on the server, and replies as the lock's) and a label for messages.
-- The kind names it in tostring.
_M.LOCK = { release = "release", extend = "extend", pttl = "pttl", label = "%s", kind = "lock" }

-- A lock object, held as far as we know. t: the transport it was taken on;
-- link: the client's { closed = boolean, sleep = the transport's sleep,
-- timeout = seconds }, closed set when the client is closed (cheaper to read
-- on every call than asking the transport); fence
-- and expires (core.now() seconds before which the lock cannot have expired)
-- may be nil when unknown; ops: its scripts (default _M.LOCK); since: when
-- the try that took it was sent (core.now()); release: the common case's
-- lock's own (_M.ONCE or _M.LEASED, below:
-- hold.lua's; t the C client).
function _M.new(t, link, key, token, fence, expires, ops, since, release)
  return setmetatable({ key = key, token = token, fence = fence, _t = t, _link = link, _state = "held",
                        _expires = expires, _ops = ops or _M.LOCK, _since = since or false,
                        release = release }, lock_mt)
end

-- The lock's name in messages: '"orders:42"', 'a permit of "api"' ...
local function named(self)
  return string_format(self._ops.label, quote(self.key))
end

local stop_lease, expires_of, lost_news = lease_mod.stop, lease_mod.expires, lease_mod.lost_news

--- Tells the client's observer (redislock.new's `observer`), if any, of an
-- event about hold ("acquired", "busy", "released", "lost",
-- "renew_failed", "handoff", "waiting", "waited", "error"): observer(event,
-- info), info = { key, kind ("lock", "permit", "read lock", "write lock",
-- "leadership") } and fields of the event (docs/operations.md). Its
-- errors are dropped: watching must not break locking.
local function observe(link, event, info)
  local observer = link.observer
  if observer then pcall(observer, event, info) end
end
_M.observe = observe

-- Records that the lock is no longer ours (why: a sentence fragment), stops
-- its renewal, calls its on_lost once, and returns the "lost" message.
local function set_lost(self, why)
  self._state = "lost"
  self._lost = string_format("lost: %s is no longer ours (%s)", named(self), why)
  stop_lease(self)
  if self._link.observer then
    observe(self._link, "lost", { key = self.key, kind = self._ops.kind, why = why,
                                  held = self._since and now() - self._since or nil })
  end
  local on_lost = self._on_lost
  if on_lost then
    self._on_lost = nil
    on_lost(self, self._lost) -- may raise, to abort the work
  end
  return self._lost
end

-- The "lost" message after a script answered status (0 or -1) at op.
local function mark_lost(self, status, op)
  local why = status == -1 and "another owner holds it now" or "it expired or was deleted"
  return set_lost(self, why .. "; found at " .. op)
end

-- The "lost" message when the lock's renewal found it lost, else nil.
local function lease_lost(self)
  if not lost_news(self) then return nil end
  local _, why = self._lease:state()
  return set_lost(self, why)
end

-- The "connection" message when the lock's client was closed, else nil.
-- Close is no release: the lock runs out by its TTL.
local function client_closed(self)
  if not self._link.closed then return nil end
  return string_format("connection: the lock's client is closed; %s runs out by its TTL", named(self))
end

-- The "lost" message when the lock is not ours by our own account (released,
-- or resigned, as a leadership's release says; or found lost, by us or by
-- its renewal), else nil.
local function no_longer_ours(self)
  if self._state == "released" then
    return string_format("lost: %s was already %s", named(self), self._ended or "released")
  end
  lease_lost(self)
  if self._state == "lost" then return self._lost end
  return nil
end

-- Why the lock cannot be used: no longer ours, or its client closed; else nil.
local function unusable(self)
  return no_longer_ours(self) or client_closed(self)
end

-- Runs the lock's script what ("release", "extend" or "pttl": the lock's
-- own or its primitive's, see _M.LOCK) on the server for a lock that is still ours by our own account;
-- fname names the public method for errors; answered: a release sent
-- already (the common case's, release_by), whose answer a and b are.
-- Returns the script's value, or nil and an error message.
local function lock_eval(self, fname, what, ms, answered, a, b)
  local op = self._ops[what]
  if self._t.io_problem then check_phase(self._t, fname) end
  -- Held, without renewal, its client open: usable (the common case, asked without a call).
  local gone = (self._state ~= "held" or self._lease or self._link.closed) and unusable(self)
  -- Stopped before anything is sent, so that no renewal runs after the
  -- release; also when the lock is gone (a loss the OpenResty timer found
  -- could not end with_lock's sentinel, which only the releasing thread may).
  if what == "release" and self._lease then stop_lease(self) end
  if gone then return nil, gone end
  -- When sent (for a retry's deadline, and the new expiry): not asked for a
  -- release whose expiry is known, the deadline then.
  local sent = (what ~= "release" or not self._expires) and now() or nil
  local status, value
  -- A lock delay lengthens what the server keeps (redislock/wait.lua's
  -- take): an extend sends it on top of the TTL, and the time left by the
  -- holder's own account is the server's less the delay.
  if what == "pttl" then
    status, value = self._t:eval(op, self.key, self.token, ms)
    local delay = self._delay_ms
    if delay and status == 1 and value >= 0 then
      if value <= delay then return nil, set_lost(self, "its TTL ran out; the lock delay keeps others out") end
      value = value - delay
    end
  else
    -- An extend of a delayed hold (a release sends no time): ms is what
    -- the server gets until the answer (below).
    if ms and self._delay_ms then
      local delay = self._delay_ms
      if ms + delay > MAX_MS then
        argerror(1, fname, string_format("ttl and the lock delay must add up to at most %.3f s", MAX_MS / 1000))
      end
      -- Past its own TTL the hold is not its holder's to lengthen, though
      -- the server keeps it for the delay.
      if sent >= (expires_of(self) or math_huge) then
        return nil, set_lost(self, "its TTL ran out; the lock delay keeps others out")
      end
      ms = ms + delay
    end
    -- A release or extend refused by a passing state is sent again while
    -- the lock may still be ours: until it expires by its last known TTL
    -- (or, unknown, for the client's timeout).
    local link, t = self._link, self._t
    if t.eval_until and not answered then
      status, value = again(link.sleep, expires_of(self) or sent + link.timeout, t, op, self.key, self.token, ms)
    else -- again's first try in place: every release makes it
      if answered then status, value = a, b else status, value = t:eval(op, self.key, self.token, ms) end
      if status == nil then
        status, value = again_from(nil, value, link.sleep, expires_of(self) or sent + link.timeout, t, op, self.key,
                                   self.token, ms)
      end
    end
  end
  if status == nil then
    -- A release that went out but whose answer did not come back may have
    -- run on the server (not so when the connection could not even be made).
    if what == "release" and unanswered(value) then
      self._release_unconfirmed = true
    end
    if self._link.observer then
      local code = value:match("^(%a+):")
      if code == "connection" or code == "redis" then
        observe(self._link, "error", { key = self.key, kind = self._ops.kind, code = code, op = what, why = value })
      end
    end
    return nil, value
  end
  if status ~= 1 then
    -- The key is gone before the lock could have expired: that earlier,
    -- unanswered release did land, and left it as this one would have.
    if status == 0 and what == "release" and self._release_unconfirmed and now() < (expires_of(self) or 0) then
      return 0
    end
    return nil, mark_lost(self, status, what)
  end
  if what == "extend" then
    local delay = self._delay_ms
    if delay then
      ms = ms - delay
      -- Extended, but its answer came after its TTL ran out (paused meanwhile).
      if now() >= (expires_of(self) or math_huge) then
        return nil, set_lost(self, "its TTL ran out before the extend came back; the lock delay keeps others out")
      end
    end
    lease_mod.extended(self, ms, sent)
  end
  return value
end

--- Releases the lock if it is still ours (compare-and-delete on the server).
-- Releasing again is harmless and returns true.
-- @treturn boolean true
-- @return[2] nil
-- @treturn[2] string "lost: ...", "connection: ..." or "redis: ..."
function Lock:release(...)
  -- The checks' usual outcomes first, without a call: every lock is released.
  if getmetatable(self) ~= lock_mt then check_self(self, lock_mt, "release", "redislock lock") end
  if select("#", ...) > 0 then check_nargs("release", 0, ...) end
  if self._state == "released" then return true end
  -- Under OpenResty a lock that keeps its worker's gate is handed down to the
  -- next request queued there when it is still ours by the clock, and its
  -- renewal is neither on its way (it could land after the next holder's)
  -- nor due (a Sentinel switch): no word to Redis (redislock/ngx_gate.lua).
  -- Else it is released on Redis and the gate left, whatever the answer.
  if self._t.io_problem then check_phase(self._t, "release") end -- whether or not it needs I/O
  local cohort = self._cohort
  self._cohort = nil
  local expires, lease = cohort and expires_of(self), self._lease
  if cohort and not unusable(self) and now() < (expires or 0) and not (lease and lease.due_now and lease:due_now())
     and cohort.gates:hand(cohort, { token = self.token, fence = self.fence, expires = expires }) then
    stop_lease(self)
  else
    local ok, err = lock_eval(self, "release", "release")
    if cohort then cohort.gates:done(cohort) end
    if not ok then return nil, err end
  end
  self._state = "released"
  if self._link.observer then
    observe(self._link, "released", { key = self.key, kind = self._ops.kind,
                                      held = self._since and now() - self._since or nil })
  end
  local note = self._note
  if note then note.released = true end
  return true
end

-- The common case's locks' release (no gate, no observer): one call, fast
-- (core.fast_release's: it checks the call too; with_lock's stops the
-- lock's renewal first), while held, its client open; done is nil for any
-- other call, nothing sent (Lock:release then), false for one sent not
-- answered 1 (lock_eval reads it).
local function release_by(fast)
  return function(self, ...)
    local done, status, value = fast(self, ...)
    if done == nil then return Lock.release(self, ...) end
    if not done then
      local ok, err = lock_eval(self, "release", "release", nil, true, status, value)
      if not ok then return nil, err end
    end
    self._state = "released"
    if self._note then self._note.released = true end
    return true
  end
end
_M.ONCE, _M.LEASED = release_by(fast_release), release_by(fast_leased)

--- Sets the lock's remaining time to ttl seconds, if it is still ours.
-- @number ttl seconds from now (fractions allowed)
-- @treturn boolean true
-- @return[2] nil
-- @treturn[2] string "lost: ...", "connection: ..." or "redis: ..."
function Lock:extend(ttl, ...)
  check_self(self, lock_mt, "extend", "redislock lock")
  local ms = check_seconds(1, "extend", "ttl", ttl)
  check_nargs("extend", 1, ...)
  local ok, err = lock_eval(self, "extend", "extend", ms)
  if not ok then return nil, err end
  return true
end

--- Remaining time of the lock in seconds, if it is still ours.
-- @treturn number seconds left (whole milliseconds)
-- @return[2] nil
-- @treturn[2] string "lost: ...", "connection: ..." or "redis: ..."
function Lock:ttl(...)
  check_self(self, lock_mt, "ttl", "redislock lock")
  check_nargs("ttl", 0, ...)
  local ms, err = lock_eval(self, "ttl", "pttl")
  if not ms then return nil, err end
  return ms / 1000
end

--- Whether the lock is still ours: true, or nil and "lost: ...". Cheap: it
-- looks at what the renewal (watchdog) found and, without renewal, at whether
-- the TTL can have run out; with server = true it also asks the server.
-- @tparam[opt] boolean server true: ask the server too
-- @treturn boolean true
-- @return[2] nil
-- @treturn[2] string "lost: ..." (or "connection: ..." / "redis: ..." when asking the server)
function Lock:check(server, ...)
  check_self(self, lock_mt, "check", "redislock lock")
  if server ~= nil and type(server) ~= "boolean" then
    argerror(1, "check", "server must be a boolean or nil, got " .. type(server))
  end
  check_nargs("check", 1, ...)
  local gone = unusable(self)
  if gone then return nil, gone end
  if lease_mod.ran_out(self) then return nil, set_lost(self, "its TTL ran out") end
  if server then
    local ms, err = lock_eval(self, "check", "pttl")
    if not ms then return nil, err end
  end
  return true
end

lock_mt.__tostring = function(self)
  return string_format("redislock %s %s (fence %s, %s)", self._ops.kind, quote(self.key), tostring(self.fence),
                       self._state)
end

-- Lua 5.4 `local l <close> = ...`: release at scope exit. When the scope is left
-- by an error, that error wins; otherwise a failed release raises, so a lost
-- lock is never passed over in silence; but not when the code closed the
-- lock's client first (cleanup in any order must not raise).
lock_mt.__close = function(self, err)
  if err ~= nil then
    pcall(self.release, self)
    return
  end
  local ok, rerr = self:release()
  if not ok and not self._link.closed then error(rerr, 0) end
end

-- lease_lost(lock): the "lost" message when the lease found the lock lost
-- (told now), else nil; the rest: redislock/lease.lua's.
_M.lease_lost, _M.stop_lease, _M.lease, _M.ours_by_clock = lease_lost, stop_lease, lease_mod.start,
      lease_mod.ours_by_clock

-- unusable(lock): why the lock cannot be used (no longer ours by our own
-- account, or its client closed), or nil; no_longer_ours(lock): the first
-- half. set_lost(lock, why): records that
-- it is no longer ours, and returns the "lost" message.
_M.unusable, _M.no_longer_ours, _M.set_lost = unusable, no_longer_ours, set_lost

-- The lock objects' class and metatable: redislock/guard.lua adds the
-- guarded writes (fenced, owned) to the class.
_M.Lock, _M.lock_mt = Lock, lock_mt

lease_mod.bind(_M)
return _M
