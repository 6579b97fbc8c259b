-- SPDX-License-Identifier: MIT

--- redislock.multilock: one lock over several keys, all taken or none
-- (client:acquire({ "acct:1", "acct:2" }, ttl) and with_lock with a list).
-- Each key is the very lock `client:acquire(key)` takes, so a multi-key lock
-- and a single lock on one of its keys exclude each other; all keys share
-- one token. Once taken it is a set of lock objects (redislock/lock.lua),
-- each renewed and released as a lock (a release wakes each key's waiters).
--
-- Taking them:
-- - on one server (and behind Sentinel): one script checks every key and
--   takes all or none, atomically (csrc/scripts/multi_acquire.lua);
-- - where keys live on several servers (a cluster, whose slots no script
--   spans; Redlock): one by one, in sorted order, each as a lock's acquire;
--   a busy key gives back those taken before it at once. Never atomic on
--   the servers, but the caller gets all or none, and holds nothing while
--   it waits.
-- Either way no two callers can deadlock, whatever order they name the keys
-- in: nobody holds a key while waiting for another. A waiter blocks on the
-- wake-up list of the key that was busy.

local args = require("redislock.args")
local core = require("redislock.core")
local hold_mod = require("redislock.hold")
local wait = require("redislock.wait")

local error, ipairs, pairs, pcall, setmetatable, type, unpack = error, ipairs, pairs, pcall, setmetatable, type,
      table.unpack or unpack -- luacheck: ignore (unpack: Lua 5.1 and LuaJIT)
local string_format, table_concat, table_sort = string.format, table.concat, table.sort
local math_huge, math_min = math.huge, math.min
local key_problem = core.key_problem
local argerror, quote, check_self, check_nargs, check_seconds = args.argerror, args.quote, args.check_self,
      args.check_nargs, args.check_seconds
local adopt, new_token = hold_mod.adopt, hold_mod.new_token
local observe_take, now = hold_mod.observe_take, core.now

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

--- A multi-key lock: what Client:acquire returns for a list of keys.
-- @type MultiLock
-- @field key the list of names, as given
-- @field token the token all its keys share
-- @field fence the keys' fences, in the order of key
local MultiLock = {}
local multi_mt = { __index = MultiLock }

-- The most keys one lock takes (its script gets three names per key).
local MAX_KEYS = 1000


-- The keys of a multi-key lock (argument n of fname), checked: a list of
-- 1..1000 distinct lock names. Returns a copy, and another in sorted order.
function _M.check_keys(n, fname, keys)
  local count = #keys
  if count == 0 or count > MAX_KEYS then
    argerror(n, fname, string_format("a list of 1 to %d keys expected, got %d", MAX_KEYS, count))
  end
  local copy, seen = {}, {}
  for k in pairs(keys) do
    if type(k) ~= "number" or k < 1 or k > count or k % 1 ~= 0 then
      argerror(n, fname, "keys must be a list (1, 2, ... n), got a field " .. args.show(k))
    end
  end
  for i = 1, count do
    local key = keys[i]
    if type(key) ~= "string" then
      argerror(n, fname, string_format("keys[%d] must be a string, got %s", i, type(key)))
    end
    local why = key_problem(key)
    if why then argerror(n, fname, string_format("keys[%d]: %s", i, why)) end
    if seen[key] then argerror(n, fname, string_format("key %s appears twice", quote(key))) end
    seen[key], copy[i] = true, key
  end
  local sorted = { unpack(copy) }
  table_sort(sorted)
  return copy, sorted
end

-- The acquire options a multi-key lock refuses, and why.
local REFUSES = { fair = "a fair queue belongs to one key",
                  replicas = "WAIT counts the writes of one connection; the keys may be on several servers",
                  delay_ms = "not built for a multi-key lock: its script and renewal keep the TTL alone" }

-- The options of a multi-key acquire, as a lock's but fair, replicas and
-- lock_delay, which it refuses.
function _M.check_how(n, fname, how)
  args.refuse(n, fname, how, REFUSES, "for a multi-key lock")
end

-- One try on one server: the multi_acquire script over every key. Answers
-- as a lock's eval: 1 and the fences (in sorted order), or -1, the busy
-- key's PTTL and that key; or nil and an error.
local function try_atomic(state, t, tok, ms)
  local sorted = state.sorted
  local reply, err = t:script("multi_acquire", sorted, tok, ms)
  if reply == nil then return nil, err end
  if reply[1] == 1 then return 1, reply[2] end
  state.busy = sorted[reply[3]]
  return -1, reply[2], state.busy
end

-- One try where keys live on several servers: each key as a lock's acquire,
-- in sorted order; a key that is busy (or fails) gives back the keys taken
-- before it (and itself, whose acquire may have landed). Answers as
-- try_atomic.
local function try_one_by_one(state, t, tok, ms)
  local fences = {}
  for i, key in ipairs(state.sorted) do
    local status, value = t:eval("acquire", key, tok, ms)
    if status ~= 1 then
      for j = status == nil and i or i - 1, 1, -1 do t:eval("release", state.sorted[j], tok) end
      if status == nil then return nil, value end
      state.busy = key
      return -1, value, key
    end
    fences[i] = value
  end
  return 1, fences
end

-- acquire(client, keys, sorted, ms, how) -> multi-key lock | nil, err:
-- keys and sorted as check_keys made them; how as args.lock_opts.
function _M.acquire(client, keys, sorted, ms, how)
  local t = client._transport
  local state = { sorted = sorted, client = client, busy = sorted[1] }
  local try = t.spread and try_one_by_one or try_atomic
  -- How wait.take tries: the lock's busy message, naming the key that was busy.
  local kind = {
    take = "acquire", acquire = "acquire",
    eval = function(c, _, _, tok, attempt_ms) return try(state, c, tok, attempt_ms) end,
    busy = function(_, value, waited)
      local mine = client._held[state.busy]
      return wait.busy_message(state.busy, value, waited, mine ~= nil and mine._state == "held" and mine or nil)
    end,
  }
  local tok = new_token(client)
  local began, waiting = client._link.observer and now(), nil
  if began then waiting = hold_mod.observe_waiting(client, how, sorted[1], "lock") end
  local got, sent = wait.take(client, sorted[1], tok, ms, how, kind)
  local fences = got and got.fence
  if got then sent = got.sent end
  if began then -- the observer hears of each key, as of single locks (their releases come one by one)
    if fences then
      for i, key in ipairs(sorted) do observe_take(client, began, key, "lock", fences[i], sent, i == 1 and waiting) end
    else
      observe_take(client, began, state.busy, "lock", nil, sent, waiting)
    end
  end
  if not fences then return nil, sent end
  local locks, by_key = {}, {}
  for i, key in ipairs(sorted) do
    local ok, lock = pcall(adopt, client, key, tok, fences[i], sent, ms, how)
    if not ok then -- renewal could not start: give every key back
      for _, l in ipairs(locks) do l:release() end
      for j = i + 1, #sorted do t:eval("release", sorted[j], tok) end
      error(lock, 0)
    end
    locks[i], by_key[key] = lock, lock
  end
  local fence = {}
  for i, key in ipairs(keys) do fence[i] = by_key[key].fence end
  return setmetatable({ key = keys, token = tok, fence = fence, _locks = locks }, multi_mt)
end

--- Releases every key that is still ours (each a compare-and-delete that
-- wakes its waiters). Releasing again is harmless.
-- @treturn boolean true
-- @return[2] nil
-- @treturn[2] string the first error ("lost: ..." for a key that was no
--   longer ours, "connection: ..." ...); the other keys are released all the same
function MultiLock:release(...)
  check_self(self, multi_mt, "release", "redislock multi-key lock")
  check_nargs("release", 0, ...)
  local first
  for _, lock in ipairs(self._locks) do
    local ok, err = lock:release()
    if not ok and not first then first = err end
  end
  if first then return nil, first end
  return true
end

--- Sets every key's remaining time to ttl seconds.
-- @number ttl seconds from now
-- @treturn boolean true
-- @return[2] nil
-- @treturn[2] string the first error ("lost: ...", "connection: ..." ...)
function MultiLock:extend(ttl, ...)
  check_self(self, multi_mt, "extend", "redislock multi-key lock")
  check_seconds(1, "extend", "ttl", ttl)
  check_nargs("extend", 1, ...)
  for _, lock in ipairs(self._locks) do
    local ok, err = lock:extend(ttl)
    if not ok then return nil, err end
  end
  return true
end

--- The shortest remaining time of its keys, in seconds.
-- @treturn number seconds
-- @return[2] nil
-- @treturn[2] string the first error ("lost: ...", "connection: ..." ...)
function MultiLock:ttl(...)
  check_self(self, multi_mt, "ttl", "redislock multi-key lock")
  check_nargs("ttl", 0, ...)
  local least = math_huge
  for _, lock in ipairs(self._locks) do
    local s, err = lock:ttl()
    if not s then return nil, err end
    least = math_min(least, s)
  end
  return least
end

--- Whether every key is still ours (as a lock's check).
-- @tparam[opt] boolean server true: ask the server too
-- @treturn boolean true
-- @return[2] nil
-- @treturn[2] string the first "lost: ..." (or "connection: ..." / "redis: ..." when asking)
function MultiLock:check(server, ...)
  check_self(self, multi_mt, "check", "redislock multi-key lock")
  if server ~= nil and type(server) ~= "boolean" then
    argerror(1, "check", "server must be a boolean or nil, got " .. type(server))
  end
  check_nargs("check", 1, ...)
  for _, lock in ipairs(self._locks) do
    local ok, err = lock:check(server)
    if not ok then return nil, err end
  end
  return true
end

-- A multi-key lock guards no writes: each key has its fence (fence[i]) and
-- no one of them stands for the lot. Said plainly, where Lua would say
-- "attempt to call a nil value".
local function no_guard(self, fname)
  check_self(self, multi_mt, fname, "redislock multi-key lock")
  args.raise_at_caller(string_format("bad self to '%s' (a multi-key lock has a fence per key (fence[i]) and "
                                     .. "guards no writes; guard them with a lock on the resource's own key)", fname))
end

--- Raises: a multi-key lock guards no writes (each key has its own fence,
-- fence[i]); guard them with a lock on the resource's own key.
-- @return never: it raises "bad self to 'fenced' (...)"
function MultiLock:fenced()
  no_guard(self, "fenced")
end

--- Raises, as fenced does: a multi-key lock owns no writes.
-- @return never: it raises "bad self to 'owned' (...)"
function MultiLock:owned()
  no_guard(self, "owned")
end

multi_mt.__tostring = function(self)
  local names = {}
  for i, key in ipairs(self.key) do names[i] = quote(key) end
  return string_format("redislock multi-key lock {%s}", table_concat(names, ", "))
end

-- Lua 5.4 `local l <close> = ...`: as a lock's (redislock/lock.lua).
multi_mt.__close = function(self, err)
  if err ~= nil then
    pcall(self.release, self)
    return
  end
  local ok, rerr = self:release()
  if not ok and not self._locks[1]._link.closed then error(rerr, 0) end
end

return _M
