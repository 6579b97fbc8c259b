-- SPDX-License-Identifier: MIT

--- redislock.rwlock: a read-write lock. Many readers at once, or one writer
-- and no reader. Writers come first: once a writer waits, new readers wait
-- behind it, so a steady stream of readers cannot starve it. Each hold (read
-- or write) is a lock object (redislock/lock.lua) with the read-write lock's
-- scripts: owned, expiring by its TTL, renewed, fenced (fences of both kinds
-- of hold from the slot's one record), released with with_lock's guarantees by with_read and
-- with_write.
--
-- On the server (csrc/scripts/), under the name's hash tag:
--   <prefix>{<name>}:rw:readers   readers' tokens by expiry (ms, server time)
--   <prefix>{<name>}:rw:writer    the writer's token, with its TTL
--   <prefix>{<name>}:rw:writers   waiting writers by deadline: a writer that
--                                 waits comes back within a second (as a fair
--                                 waiter), else it drops out after 3 s
--   <prefix>{<name>}:rw:signal, :rw:waiters  the wake-up list, waiters
--                                 by deadline
--   <prefix>{<name>}:rw:queue, :rw:hand  the writers registered for a
--                                 handoff, as a lock's (csrc/scripts/README.md,
--                                 "Handing over"); each blocks on
--                                 :rw:signal:<token>
-- A write release and the last reader's release hand the write lock to the
-- first registered writer; with none, they (and a waiting writer that gives
-- up) wake every waiter (each retries; readers may all get in).

local args = require("redislock.args")
local core = require("redislock.core")
local hold_mod = require("redislock.hold")
local lock_mod = require("redislock.lock")
local transport = require("redislock.transport")

local pairs, setmetatable = pairs, setmetatable
local string_format = string.format
local check_self, check_nargs, quote, check_fn = args.check_self, args.check_nargs, args.quote, args.check_fn
local hold, hold_args, with_hold = hold_mod.hold, hold_mod.hold_args, hold_mod.with_hold

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

--- A read-write lock: what Client:rwlock returns. No I/O until its methods.
-- @type RWLock
local RWLock = {}
local rwlock_mt = { __index = RWLock }

-- The scripts and names of the holds of side "read" or "write" (see
-- redislock/lock.lua's LOCK): <side>_release, <side>_extend, <side>_pttl.
local function holds(side)
  return { release = side .. "_release", extend = side .. "_extend", pttl = side .. "_pttl",
           label = "the " .. side .. " lock on %s", kind = side .. " lock" }
end
local READ, WRITE = holds("read"), holds("write")

-- The busy message of a read or a write (value: ms until it may change:
-- the writer's TTL, the last reader's, or the waiting writers' stay); hint:
-- why, when this caller's own hold is in the way.
local function busy_of(mode, hint)
  local state = mode == "read" and "held or awaited by a writer" or "held by a writer or readers"
  local detail = hint and mode .. "; " .. hint or mode
  return function(name, value, waited)
    if waited > 0 then
      return string_format("busy: read-write lock %s is still %s after waiting %.3g s (%s; %.3g s left)",
                           quote(name), state, waited, detail, value / 1000)
    end
    return string_format("busy: read-write lock %s is %s (%s; %.3g s left)", quote(name), state, detail, value / 1000)
  end
end

-- The holds each client took, by mode and name, for those hints (weakly:
-- client -> { read = { name -> hold }, write = { name -> hold } }).
local holding = setmetatable({}, { __mode = "k" })

local function noter(mode)
  return function(client, name, h)
    local mine = holding[client]
    if not mine then
      mine = { read = setmetatable({}, { __mode = "v" }), write = setmetatable({}, { __mode = "v" }) }
      holding[client] = mine
    end
    h._context = transport.context()
    mine[mode][name] = h
  end
end

-- How wait.take takes each: no cheaper first try than the script; a writer
-- stays queued while it waits (which keeps new readers out) and leaves the
-- queue when it gives up; a writer that blocks registers for a handoff
-- (hand: a write release, or the last reader's, hands it the write lock,
-- a renewing one with a short first TTL as a lock's waiter, first_ttl); a
-- reader comes back every second (unwoken: a write lock handed to a writer
-- gone is taken back by the next try, and wakes nobody). note: adopt
-- records the hold.
local READER = { take = "read_acquire", acquire = "read_acquire", wait = "read_acquire", ops = READ, unwoken = true,
                 busy = busy_of("read"), note = noter("read") }
local WRITER = { take = "write_acquire", acquire = "write_acquire", wait = "write_acquire", ops = WRITE,
                 hand = "write_acquire_wait", first_ttl = true, stays = true, leave = "write_leave",
                 busy = busy_of("write"), note = noter("write") }

-- The same, but with a hint in the busy message.
local function hinted(kind, mode, hint)
  local k = {}
  for name, v in pairs(kind) do k[name] = v end
  k.busy = busy_of(mode, hint)
  return k
end
local NOT_REENTRANT = "locks are not reentrant"
local HINTED = {
  [READER] = { write = hinted(READER, "read", "this caller holds its write lock: " .. NOT_REENTRANT) },
  [WRITER] = { write = hinted(WRITER, "write", "this caller holds its write lock: " .. NOT_REENTRANT),
               read = hinted(WRITER, "write", "this caller holds a read lock on it, which does not turn into "
                                              .. "the write lock: release it first") },
}

-- kind, or its hinted variant when this caller (this client; under
-- OpenResty, this request) holds a hold of name that is in the way.
local function kind_for(client, name, kind)
  local mine = holding[client]
  if not mine then return kind end
  local context = transport.context()
  for mode, variant in pairs(HINTED[kind]) do
    local h = mine[mode][name]
    if h and h._context == context and lock_mod.ours_by_clock(h) then return variant end
  end
  return kind
end

-- new(client, name): client:rwlock(name), after the client and name were
-- checked (client.lua). No I/O.
function _M.new(client, name, ...)
  check_nargs("rwlock", 1, ...)
  return setmetatable({ name = name, _client = client }, rwlock_mt)
end

-- The acquire options a read-write lock refuses, and why.
local REFUSES = { fair = "writers come first; readers are not queued" }

-- The ttl (in ms) and options of fname (nopts: the options' argument
-- number), checked; refuses a closed client.
local function take_args(self, fname, ttl, opts, scoped, nopts)
  return hold_args(self._client, fname, ttl, opts, nopts, scoped, REFUSES, "for a read-write lock")
end

--- Takes a read hold for ttl seconds: shared with other readers, while no
-- writer holds the lock or waits for it.
-- @number ttl seconds (fractions allowed)
-- @tparam[opt] redislock.client.lock_options opts as a lock's acquire (not fair)
-- @treturn redislock.lock.Lock the hold (key, token, fence; release, extend, ttl, check)
-- @return[2] nil
-- @treturn[2] string "busy: ...", "connection: ..." or "redis: ..."
function RWLock:read(ttl, opts, ...)
  check_self(self, rwlock_mt, "read", "redislock rwlock")
  local ms, how = take_args(self, "read", ttl, opts, false, 2)
  check_nargs("read", 2, ...)
  return hold(self._client, self.name, ms, how, kind_for(self._client, self.name, READER))
end

--- Takes the write hold for ttl seconds: no other writer, no reader.
-- @number ttl seconds (fractions allowed)
-- @tparam[opt] redislock.client.lock_options opts as a lock's acquire (not fair)
-- @treturn redislock.lock.Lock the hold
-- @return[2] nil
-- @treturn[2] string "busy: ...", "connection: ..." or "redis: ..."
function RWLock:write(ttl, opts, ...)
  check_self(self, rwlock_mt, "write", "redislock rwlock")
  local ms, how = take_args(self, "write", ttl, opts, false, 2)
  check_nargs("write", 2, ...)
  return hold(self._client, self.name, ms, how, kind_for(self._client, self.name, WRITER))
end

-- with_read and with_write: fn(hold) under a hold, with with_lock's
-- guarantees (redislock/scope.lua).
local function with(self, kind, fname, ttl, fn, opts, ...)
  local ms, how = take_args(self, fname, ttl, opts, true, 3)
  check_fn(2, fname, fn)
  check_nargs(fname, 3, ...)
  return with_hold(self._client, self.name, ms, how, kind_for(self._client, self.name, kind), fn)
end

--- Calls fn(hold) under a read hold, then releases it; as with_lock: returns
-- what fn returned, re-raises its error unchanged, raises "busy: ...",
-- "connection: ..." or "lost: ...".
-- @number ttl seconds: renewed every third of it while fn runs
-- @func fn function(hold): the work
-- @tparam[opt] redislock.client.lock_options opts as a lock's acquire (not fair)
-- @return what fn returned, all of it
-- @raise "busy: ...", "connection: ..." or "redis: ..." when it cannot be had;
--   fn's own error, unchanged; "lost: ..." when it was no longer ours
function RWLock:with_read(ttl, fn, opts, ...)
  check_self(self, rwlock_mt, "with_read", "redislock rwlock")
  return with(self, READER, "with_read", ttl, fn, opts, ...)
end

--- Calls fn(hold) under the write hold, then releases it (as with_read).
-- @number ttl seconds: renewed every third of it while fn runs
-- @func fn function(hold): the work
-- @tparam[opt] redislock.client.lock_options opts as a lock's acquire (not fair)
-- @return what fn returned, all of it
-- @raise "busy: ...", "connection: ..." or "redis: ..." when it cannot be had;
--   fn's own error, unchanged; "lost: ..." when it was no longer ours
function RWLock:with_write(ttl, fn, opts, ...)
  check_self(self, rwlock_mt, "with_write", "redislock rwlock")
  return with(self, WRITER, "with_write", ttl, fn, opts, ...)
end

rwlock_mt.__tostring = function(self)
  return string_format("redislock rwlock %s", quote(self.name))
end

return _M
