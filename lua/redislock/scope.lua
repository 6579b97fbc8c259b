-- SPDX-License-Identifier: MIT
--- redislock.scope: running fn while holding something, and letting go of it
-- on every way out (with_lock; a semaphore's with_permit builds on the same).
-- fn returns or raises: released, fn's results or error passed on unchanged.
-- A coroutine closed inside fn (Lua 5.4): released by a to-be-closed guard.
-- on_lost aborting fn (plain Lua): see below.

local args = require("redislock.args")
local lease_mod = require("redislock.lease")
local lock_mod = require("redislock.lock")

local collectgarbage, error, ipairs, pcall, setmetatable = collectgarbage, error, ipairs, pcall, setmetatable
local coroutine_running = coroutine.running
local debug_getinfo, debug_gethook, debug_sethook = debug.getinfo, debug.gethook, debug.sethook

local _M = { _VERSION = args._VERSION }

args.own(debug.getinfo(1, "S").source)

-- Calls fn(lock) protected and hands finish(guard, lock, scope, ok, ...) its
-- results, with no table in between. On Lua 5.4 the lock is also held by a
-- to-be-closed guard while fn runs, so that closing a coroutine suspended
-- inside fn (coroutine.close) releases it; finish clears guard.lock first, so
-- the guard does nothing once fn has come back. A coroutine that is merely
-- dropped keeps the lock (renewed) until the garbage collector collects it:
-- collection does no I/O.
local call_locked = function(lock, fn, finish, scope) return finish(nil, lock, scope, pcall(fn, lock)) end
if load("local guard <close> = nil") then -- Lua 5.4 and later
  local guard_mt = {
    __close = function(guard)
      if guard.lock then pcall(guard.lock.release, guard.lock) end
    end,
  }
  -- Compiled by load() so that LuaJIT, which cannot parse <close>, loads this file.
  call_locked = assert(load([[
    local pcall, setmetatable, guard_mt = ...
    return function(lock, fn, finish, scope)
      local guard <close> = setmetatable({ lock = lock }, guard_mt)
      return finish(guard, lock, scope, pcall(fn, lock))
    end
  ]], "=redislock.with_lock"))(pcall, setmetatable, guard_mt)
  args.own("=redislock.with_lock")
end

-- While fn runs, a count hook looks at the watchdog's news every 10,000 VM
-- instructions, so that on_lost runs (and may raise to abort fn) soon after
-- the lease is lost, even in pure computation. Only where no other hook is
-- set, and in plain Lua (under OpenResty the renewal timer calls on_lost).
-- LuaJIT runs no hooks in compiled code: there on_lost comes when fn calls
-- lock:check() (or returns).
--
-- Such an abort strikes at any instruction, so two rules keep it from
-- stranding a lock fn was taking: it is never delivered while redislock's own
-- code runs, and when it did abort fn, the locks fn took that nothing refers
-- to any more are released (fn may have been stopped between acquire's
-- return and the variable that would have released it). So each lock taken
-- in a watched scope gets a note (lock.note, which refers to the lock
-- weakly); notes of released locks are dropped as they pile up.
--
-- A deferred abort is looked at again after a few hundred instructions, a
-- different number each time: with a fixed count, a loop whose length
-- divides it would meet the hook at the same instruction, inside redislock,
-- every time, for ever.
--
-- A scope: { lock, co, parent (the scope it hides), taken = { note, ... }
-- (note.ref: the lock, weakly; made by the first note), compact_at,
-- deferred, aborted }. Scopes stack per coroutine (LuaJIT's main one is
-- MAIN). One hook function serves every scope: it finds the running
-- coroutine's (hooks are per coroutine), so that a scope costs no closure.
local MAIN = {}
local scopes = setmetatable({}, { __mode = "k" })
local RETRY_STEPS = { 101, 211, 307, 401, 503, 601, 701, 809, 907 } -- primes

--- How many scopes watch now (read by acquire, which calls note_taken only
-- then; a scope in a coroutine that was dropped is never ended, and keeps
-- acquire on the slower path, which is still correct).
_M.watching = 0

local function running()
  return coroutine_running() or MAIN
end

local WEAK_VALUES = { __mode = "v" }

-- A note on lock for whoever must release it if its owner drops it:
-- note.stand_in, a new lock object for the same key and token (that does not
-- refer to lock); note.ref[1], lock itself, weakly (nil once collected);
-- note.released, true once lock is released.
local function note_of(lock)
  local n = { stand_in = lock_mod.new(lock._t, lock._link, lock.key, lock.token, lock.fence, nil, lock._ops),
              ref = setmetatable({ lock }, WEAK_VALUES) }
  lock._note = n
  return n
end

--- Notes a lock just taken in the current coroutine's scope, if any (called
-- by acquire while _M.watching > 0).
function _M.note_taken(lock)
  local scope = scopes[running()]
  if not scope then return end
  local taken = scope.taken
  if not taken then
    taken = {}
    scope.taken = taken
  end
  taken[#taken + 1] = note_of(lock)
  if #taken >= scope.compact_at then
    -- A loop taking and releasing locks inside fn must not grow this.
    local kept = {}
    for _, n in ipairs(taken) do
      if not n.released then kept[#kept + 1] = n end
    end
    scope.taken, scope.compact_at = kept, 2 * #kept + 64
  end
end

-- The count hook of every scope (see above).
local function hook()
  local scope = scopes[running()]
  if not scope or not lease_mod.lost_news(scope.lock) then return end
  if args.is_own(debug_getinfo(2, "S").source) then -- inside redislock: look again soon, elsewhere
    scope.deferred = scope.deferred % #RETRY_STEPS + 1
    debug_sethook(hook, "", RETRY_STEPS[scope.deferred])
    return
  end
  scope.aborted = true
  lock_mod.lease_lost(scope.lock) -- calls on_lost, which may raise
end

-- Starts watching lock for on_lost while fn runs; returns the scope, or nil.
local function watch_lost(lock)
  if not lease_mod.watchable(lock) or debug_gethook() then return nil end
  local co = running()
  local scope = { lock = lock, co = co, parent = scopes[co], taken = false, compact_at = 64, deferred = 0 }
  scopes[co] = scope
  _M.watching = _M.watching + 1
  debug_sethook(hook, "", 10000)
  return scope
end

-- Ends the scope; ok: fn returned normally. A hook fn set for itself stays.
local function unwatch(scope, ok)
  scopes[scope.co] = scope.parent
  _M.watching = _M.watching - 1
  if debug_gethook() == hook then debug_sethook() end
  if ok or not scope.aborted or not scope.taken or #scope.taken == 0 then return end
  -- Aborted: fn's frames are gone, so a lock nothing else refers to is
  -- collected now; release those (a lock released before is left alone by
  -- the compare-and-delete).
  collectgarbage("collect")
  for _, note in ipairs(scope.taken) do
    if note.ref[1] == nil and not note.released then pcall(note.stand_in.release, note.stand_in) end
  end
end

--- Calls fn(lock) for a lock just taken, releases the lock in every case and
-- returns exactly what fn returned. Raises fn's own error value (unchanged)
-- when fn raises, a "lost: ..." error when the lock was no longer ours at
-- release, or the release's "connection: ..." error.
-- After fn: ends the scope, releases, and returns fn's results or raises.
local function finish(guard, lock, scope, ok, ...)
  if guard then guard.lock = nil end -- fn came back: release here, and report
  if scope then unwatch(scope, ok) end
  -- Protected: fn's own error must be the one that comes out, whatever
  -- release does.
  local rok, released, rerr = pcall(lock.release, lock)
  if not ok then error((...), 0) end
  if not rok then error(released, 0) end
  if not released then error(rerr, 0) end
  return ...
end

function _M.hold(lock, fn)
  -- Without an on_lost there is nothing to watch (asked without a call).
  return call_locked(lock, fn, finish, lock._on_lost ~= nil and watch_lost(lock) or nil)
end

return _M
