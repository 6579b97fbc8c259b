-- SPDX-License-Identifier: MIT
--- redislock.hold: the machinery every hold shares (a lock, a permit, a read
-- or write hold, a multi-key lock): what a client is and whether it is
-- open, a hold's token, taking it (waiting, renewal, the observer), the
-- scoped form, the checked arguments of a primitive's acquire, and the
-- names the C core gives a lock's keys. The client (redislock/client.lua)
-- and the primitives (semaphore, rwlock, multilock, admin, guard) require
-- it; it requires none of them.

local args = require("redislock.args")
local backoff = require("redislock.backoff")
local core = require("redislock.core")
local lease_mod = require("redislock.lease")
local lock_mod = require("redislock.lock")
local scope = require("redislock.scope")
local transport = require("redislock.transport")
local wait = require("redislock.wait")

local getmetatable, error = getmetatable, error
local string_format = string.format
local now, error_class = core.now, core.error_class
local observe = lock_mod.observe
local try, take, note_taken = wait.try, wait.take, scope.note_taken
local raise_at_caller, quote, check_seconds, check_phase, lock_opts = args.raise_at_caller, args.quote,
      args.check_seconds, args.check_phase, args.lock_opts

local cool, not_taken, check_self = wait.cool, wait.not_taken, args.check_self
local ONCE_RELEASE, LEASED = lock_mod.ONCE, lock_mod.LEASED

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

--- The clients' metatable (redislock/client.lua fills its __index, the
-- Client methods).
local client_mt = { __index = {} }
_M.client_mt = client_mt

--- Whether x is a client (of redislock.new).
function _M.is_client(x)
  return getmetatable(x) == client_mt
end

--- Whether the client was closed.
function _M.closed(client)
  return client._link.closed
end

--- Refuses a client that was closed.
local function check_not_closed(client, fname)
  if client._link.closed then
    raise_at_caller(string_format("bad self to '%s' (client is closed)", fname))
  end
end

--- Refuses a client that was closed, and I/O where nginx forbids it.
local function check_open(client, fname)
  check_not_closed(client, fname)
  check_phase(client._transport, fname)
end
_M.check_not_closed, _M.check_open = check_not_closed, check_open

--- check_self for clients, refusing closed ones, for calls that do no I/O
-- (allowed in any nginx phase; what they make checks its own).
local function check_live(self, fname)
  check_self(self, client_mt, fname, "redislock client")
  check_not_closed(self, fname)
end

--- check_self for clients, refusing closed ones too, and I/O where nginx
-- forbids it (check_phase). The usual outcome is found first: a client's
-- calls may be in a hot loop.
function _M.check_client(self, fname)
  if getmetatable(self) == client_mt and not self._link.closed and not self._transport.io_problem then return end
  check_live(self, fname)
  check_phase(self._transport, fname)
end
_M.check_live = check_live

--- The clients whose acquire has its common case in one call (taken):
-- client -> its C client, which makes their tokens (redislock/client.lua's
-- new notes them: one server in plain Lua, no observer). Weak keys; read
-- safely whatever the key.
_M.FAST = setmetatable({}, { __mode = "k" })


-- Makes the lock object for a hold just taken (fence: its fence; sent:
-- core.now() when the successful attempt was sent; cohort: a record of
-- the waiting strategy that goes with the lock, under OpenResty the gate
-- it keeps in its nginx worker, see wait.take; expires: when the first TTL a
-- handoff gave it ends, when shorter than ms; delay: the lock delay take
-- added, or nil) and, with how.renew, starts its renewal; notes it for
-- messages and with_lock's scope.
local function adopt(self, key, tok, fence, sent, ms, how, kind, cohort, expires, delay)
  local t = self._transport
  -- The lock cannot expire on the server before sent + ms (the TTL started
  -- after the send), by the monotonic clock; a lock handed down as it is
  -- (cohort.expires) when its last holder's could, one handed over with a
  -- shorter first TTL when that ends, and its renewal is due as if it had
  -- been taken then with this TTL (at once, for the latter).
  local inherited = cohort and cohort.expires or expires
  local lock = lock_mod.new(t, self._link, key, tok, fence,
                            inherited or sent + (t.validity_ms and t:validity_ms(ms) or ms) / 1000, kind and kind.ops,
                            sent)
  if delay then lock._delay_ms = delay end -- its extend and ttl reckon with it (lock.lua)
  if cohort then
    lock._cohort = cohort
    cohort.gates:keep(cohort, lock)
  end
  if how.renew then
    lock_mod.lease(lock, how, ms, inherited and inherited - ms / 1000 or sent)
    self._renewed[lock] = true
  end
  if not kind then
    self._held[key] = lock
    if transport.contexts then lock._context = transport.context() end
  elseif kind.note then
    kind.note(self, key, lock)
  end
  if scope.watching > 0 then note_taken(lock) end
  return lock
end
_M.adopt = adopt

--- A new token for a hold by client self: 32 random hex digits, then who
-- holds it (unless holder = false): /<host>/<pid>/<since, unix seconds>[/<label>].
-- Made by the client's core.tokens maker, in C, as its C client's common
-- acquire makes them (client:holder): the format is written there once.
local function new_token(self)
  return self._token()
end
_M.new_token = new_token

--- Tells the client's observer how a take that began at began (core.now())
-- ended: "acquired" (fence, and sent: when the successful try was sent),
-- "busy" or "error" (sent: the message; code: "connection" or "redis");
-- waiting: the info of its "waiting" event, if any: "waited" (its key and
-- kind) is told first.
local function observe_take(self, began, key, kind, fence, sent, waiting)
  local link = self._link
  if waiting then observe(link, "waited", { key = waiting.key, kind = waiting.kind }) end
  if fence then
    observe(link, "acquired", { key = key, kind = kind, fence = fence, wait = sent - began })
    return
  end
  local code = sent:match("^(%a+):")
  if code == "busy" then
    observe(link, "busy", { key = key, kind = kind, waited = now() - began, why = sent })
  elseif code == "connection" or code == "redis" then
    observe(link, "error", { key = key, kind = kind, code = code, op = "acquire", why = sent })
  end
end
_M.observe_take = observe_take

--- Tells the client's observer that a caller given a wait (how.wait > 0)
-- starts to take key: "waiting"; returns its info for observe_take, or nil
-- without a wait.
function _M.observe_waiting(self, how, key, kind)
  if how.wait <= 0 then return nil end
  local info = { key = key, kind = kind }
  observe(self._link, "waiting", info)
  return info
end
local observe_waiting = _M.observe_waiting

-- Whether an acquire that failed with err left nothing to give back: its
-- call says so (left, the call's word beside err, rl_call.c: "nothing",
-- given back; "staying", not, its release script goes), or, the call
-- silent, its script ran nothing: the script's command
-- itself was refused (class "refused": the user may not run EVALSHA, or
-- touch its keys; no such script; no memory for a script that declares
-- writes), or a passing state refused it (READONLY, LOADING ...:
-- redislock/backoff.lua's passing). An error from a command within a script
-- (class "script") ran up to there.
local function ran_nothing(err, left)
  if left then return left == "nothing" end
  return backoff.passing(err) or error_class(err) == "refused"
end

-- acquire after its arguments were checked (how.scoped: with_lock's lock,
-- which must not outlive the running thread, see redislock/ngx_lease.lua);
-- kind: how to take it (wait.take's; nil for a lock; kind.tail, when
-- set, ends the token). tried: the token of a lock's one try made already
-- (redislock/client.lua's common case), whose answer fence, sent and
-- left are.
local function acquire(self, key, ms, how, kind, tried, fence, sent, left)
  local tok, t = tried or new_token(self), self._transport
  if kind and kind.tail then tok = tok .. kind.tail end -- an election's value (redislock/election.lua)
  local began, waiting = self._link.observer and now(), nil
  if began then waiting = observe_waiting(self, how, key, kind and kind.ops.kind or "lock") end
  -- One try (every uncontended acquire), without the waiting machinery;
  -- else wait.take's record.
  if not tried then fence, sent, left = try(self, key, tok, ms, how, kind) end
  local got
  if fence == false then
    got, sent, left = take(self, key, tok, ms, how, kind)
    if got then fence, sent = got.fence, got.sent end
  end
  if began then observe_take(self, began, key, kind and kind.ops.kind or "lock", fence, sent, waiting) end
  if not fence then
    -- Refused after a step that may have taken it (a script that wrote, then
    -- met a command the user may not run): no hold of nobody's is left for
    -- its TTL. The token is this try's own; its release compares it on the
    -- server. A refusal of the script's command itself (NOPERM for EVALSHA,
    -- NOSCRIPT, OOM) or for a passing state (READONLY, LOADING ...) ran
    -- nothing, and a call that gave its take's lock back says so beside
    -- its message (left): nothing to give back, and no release to try
    -- (ran_nothing). One that could not ("staying") is given back here
    -- when Redis refused it; the message ends with what is left.
    local stays
    if sent:sub(1, 6) == "redis:" and not ran_nothing(sent, left) then
      stays = t:eval(kind and kind.ops.release or "release", key, tok) == nil
      if not stays and left == "staying" then sent = sent .. "; nothing its first try took is left" end
    end
    if stays or (left == "staying" and stays == nil) then
      sent = sent .. string_format("; %s may stay taken by this failed try until its TTL runs out",
                                   kind and kind.ops.label:format(quote(key)) or quote(key))
    end
    return nil, sent
  end
  if not got then return adopt(self, key, tok, fence, sent, ms, how, kind) end
  tok = got.token -- a lock handed down within the worker keeps its token
  local acked, cohort = got.acked, got.cohort
  if how.replicas and (not acked or acked < how.replicas) then
    lock_mod.new(t, self._link, key, tok, nil, nil, kind and kind.ops):release() -- give it back
    if cohort then cohort.gates:done(cohort) end
    if not acked then return nil, got.werr end -- taken, but the WAIT failed
    -- not durable enough to count as taken
    return nil, string_format("redis: %s reached %d of %d replica%s within %.3g s (WAIT), so it was released",
                              kind and kind.ops.label:format(quote(key)) or quote(key), acked, how.replicas,
                              how.replicas == 1 and "" or "s", how.replica_ms / 1000)
  end
  return adopt(self, key, tok, fence, sent, ms, how, kind, cohort, got.expires, got.delay)
end

-- How the common case takes a lock: no options.
local ONCE = lock_opts(3, "acquire", nil, false)

--- taken(client, t, key, fence, tok, a, b, left[, release]) -> lock | nil,
-- err: what Client:acquire's common case answers (client one of FAST's, t
-- its C client) after core.fast_take sent the take with token tok: taken
-- (fence; sent at a, its TTL ends at b; release: the lock's own, default
-- lock.lua's ONCE), or not (fence false; status a and value b, and what a
-- failed take left, as the general path takes them).
local function taken(self, t, key, fence, tok, a, b, left, release)
  if fence then
    local lock = lock_mod.new(t, self._link, key, tok, fence, b, nil, a, release or ONCE_RELEASE)
    self._held[key] = lock
    if scope.watching > 0 then note_taken(lock) end
    local hot = self._hot
    if hot.n > 0 then cool(hot, key) end
    return lock
  end
  return acquire(self, key, nil, ONCE, nil, tok, not_taken(self, key, a, b, left))
end
_M.taken = taken

--- with_taken(client, t, key, fn, fence, tok, a, b, lease, ms): what
-- Client:with_lock's common case does once core.fast_with answered (as
-- fast_take, and lease: the lock's renewal, ms its TTL; or nil and why
-- it could not start): fn(lock) under scope.hold, the lock renewed and
-- released as with_hold's (lock.lua's LEASED); or raises why not, as
-- with_hold does.
function _M.with_taken(self, t, key, fn, fence, tok, a, b, lease, ms)
  -- (On a failed take, fast_with's lease slot holds what it left, as fast_take's.)
  local lock, err = taken(self, t, key, fence, tok, a, b, lease, LEASED)
  if not lock then error(err, 0) end
  lease_mod.took(lock, lease, ms)
  self._renewed[lock] = true
  return scope.hold(lock, fn)
end

--- hold(client, key, ms, how, kind) -> hold | nil, err: takes
-- key as kind says (redislock/wait.lua's kind, with ops: the hold's scripts,
-- redislock/lock.lua's), waiting, renewing and noting it as a lock; for
-- the primitives (redislock/semaphore.lua, redislock/rwlock.lua).
_M.hold = acquire

--- with_hold(client, key, ms, how, kind, fn): with_lock for any hold:
-- takes it (kind nil: a lock), or raises why not; then fn(hold) under
-- scope.hold (released on every way out, fn's results or error passed on).
function _M.with_hold(self, key, ms, how, kind, fn)
  local h, err = acquire(self, key, ms, how, kind)
  if not h then error(err, 0) end
  return scope.hold(h, fn)
end

--- The arguments of a primitive's acquire or with_ on client (fname; ttl is
-- argument 1, opts argument nopts), checked, the client too: returns the
-- ttl in ms and how to take the hold. no (option -> why not) and where
-- ("for a semaphore") name the acquire options the primitive refuses.
function _M.hold_args(client, fname, ttl, opts, nopts, scoped, no, where)
  check_open(client, fname)
  local ms = check_seconds(1, fname, "ttl", ttl)
  local how = lock_opts(nopts, fname, opts, scoped)
  args.refuse(nopts, fname, how, no, where)
  return ms, how
end

--- The name of the lock on key, as the C core makes it ("<prefix>{<key>}");
-- the names of its other keys add a suffix (":fence" ...).
function _M.lock_name(client, key)
  return client.prefix .. "{" .. key .. "}"
end

return _M
