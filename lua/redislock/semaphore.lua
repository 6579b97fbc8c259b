-- SPDX-License-Identifier: MIT

--- redislock.semaphore: a counting semaphore. At most `limit` permits of a
-- name are held at once; each permit is owned (a token of its own), expires
-- by its TTL on the server's clock, can be renewed and fenced, and is given
-- back by a release that wakes one waiter. A permit is a lock object
-- (redislock/lock.lua) with the semaphore's scripts, so extend, ttl, check,
-- release, <close>, renewal and with_permit's guarantees are the lock's.
--
-- On the server (csrc/scripts/): <prefix>{<name>}:permits, a sorted set of
-- tokens by expiry (ms, server time), which the next acquire prunes, so that
-- a holder that died gives its permit back by its TTL; beside it a wake-up
-- list and a waiters mark, all under the name's hash tag. Fences come from
-- the slot's fence record (csrc/scripts/README.md, "Fences").

local admin = require("redislock.admin")
local args = require("redislock.args")
local core = require("redislock.core")
local hold_mod = require("redislock.hold")

local setmetatable = setmetatable
local string_format = string.format
local check_self, check_nargs, check_whole, quote, check_fn =
      args.check_self, args.check_nargs, args.check_whole, args.quote, args.check_fn
local hold, hold_args, with_hold, check_open = hold_mod.hold, hold_mod.hold_args, hold_mod.with_hold,
      hold_mod.check_open

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

--- A semaphore: what Client:semaphore returns. No I/O until its methods.
-- @type Semaphore
local Semaphore = {}
local semaphore_mt = { __index = Semaphore }

-- A permit's scripts and names (see redislock/lock.lua's LOCK).
local PERMIT = { release = "sem_release", extend = "sem_extend", pttl = "sem_pttl",
                 label = "a permit of semaphore %s", kind = "permit" }

-- The largest limit: Redis counts a sorted set's members in 32 bits here.
local MAX_LIMIT = 2 ^ 31 - 1

-- new(client, name, limit): client:semaphore(name, limit), after the
-- client and name were checked (client.lua). No I/O. limit: a whole number >= 1.
function _M.new(client, name, limit, ...)
  check_whole(2, "semaphore", "limit", limit, 1, MAX_LIMIT)
  check_nargs("semaphore", 2, ...)
  local label = quote(name)
  -- How wait.take takes a permit: there is no cheaper first try than the
  -- script; a waiter that blocks registers, and a release hands it the
  -- permit (or wakes one waiter of the semaphore's shared list).
  local kind = {
    take = "sem_acquire", acquire = "sem_acquire", hand = "sem_acquire_wait", leave = "sem_leave",
    wait = "sem_acquire", n = limit, ops = PERMIT,
    busy = function(_, value, waited)
      local left = string_format("%.3g s until one expires", value / 1000)
      if waited > 0 then
        return string_format("busy: all %d permits of semaphore %s are still taken after waiting %.3g s (%s)",
                             limit, label, waited, left)
      end
      return string_format("busy: all %d permits of semaphore %s are taken (%s)", limit, label, left)
    end,
  }
  return setmetatable({ name = name, limit = limit, _client = client, _kind = kind }, semaphore_mt)
end

-- The acquire options a semaphore refuses, and why.
local REFUSES = { fair = "a newcomer that finds a permit free takes it; waiters that block are handed permits"
                           .. " in the order they registered" }

--- Takes a permit for ttl seconds.
-- @number ttl seconds (fractions allowed): the permit expires by itself after it
-- @tparam[opt] redislock.client.lock_options opts as a lock's acquire (not fair)
-- @treturn redislock.lock.Lock the permit (permit.key: the semaphore's name,
--   permit.token, permit.fence; release, extend, ttl, check as a lock's)
-- @return[2] nil
-- @treturn[2] string "busy: ...", "connection: ..." or "redis: ..."
function Semaphore:acquire(ttl, opts, ...)
  check_self(self, semaphore_mt, "acquire", "redislock semaphore")
  local ms, how = hold_args(self._client, "acquire", ttl, opts, 2, false, REFUSES, "for a semaphore")
  check_nargs("acquire", 2, ...)
  return hold(self._client, self.name, ms, how, self._kind)
end

--- Calls fn(permit) while holding a permit, then gives it back, with
-- with_lock's guarantees: returns exactly what fn returned; raises "busy:
-- ..." or "connection: ..." when no permit can be had, fn's own error value
-- (unchanged) when fn raises, and "lost: ..." when the permit was no longer
-- ours at release. Renewed while fn runs, as with_lock's lock.
-- @number ttl seconds: renewed every third of it while fn runs
-- @func fn function(permit): the work
-- @tparam[opt] redislock.client.lock_options opts as a lock's acquire (not fair)
-- @return what fn returned, all of it
-- @raise "busy: ...", "connection: ..." or "redis: ..." when it cannot be had;
--   fn's own error, unchanged; "lost: ..." when it was no longer ours
function Semaphore:with_permit(ttl, fn, opts, ...)
  check_self(self, semaphore_mt, "with_permit", "redislock semaphore")
  local ms, how = hold_args(self._client, "with_permit", ttl, opts, 3, true, REFUSES, "for a semaphore")
  check_fn(2, "with_permit", fn)
  check_nargs("with_permit", 3, ...)
  return with_hold(self._client, self.name, ms, how, self._kind, fn)
end

--- How many permits are held now (expired ones not counted).
-- @treturn int how many
-- @return[2] nil
-- @treturn[2] string "connection: ..." or "redis: ..."
function Semaphore:count(...)
  check_self(self, semaphore_mt, "count", "redislock semaphore")
  check_open(self._client, "count")
  check_nargs("count", 0, ...)
  local status, value = self._client._transport:eval("sem_count", self.name, "count")
  if status == nil then return nil, value end
  return value
end

--- Who holds a permit now, for operators (`redislock status`): a list of
-- { token, ttl (seconds left), holder (who, from the token: { host, pid,
-- since, label }, as Client:inspect's) }, the first to expire first.
-- @treturn {table,...} the permits held (empty when none)
-- @return[2] nil
-- @treturn[2] string "connection: ..." or "redis: ..."
function Semaphore:holders(...)
  check_self(self, semaphore_mt, "holders", "redislock semaphore")
  check_open(self._client, "holders")
  check_nargs("holders", 0, ...)
  local reply, err = self._client._transport:script("sem_holders", self.name)
  if reply == nil then return nil, err end
  local held = {}
  for i = 1, #reply - 1, 2 do
    held[#held + 1] = { token = reply[i], ttl = reply[i + 1] / 1000, holder = admin.holder_of(reply[i]) }
  end
  return held
end

semaphore_mt.__tostring = function(self)
  return string_format("redislock semaphore %s (limit %s)", quote(self.name), args.show(self.limit))
end

return _M
