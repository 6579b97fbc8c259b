-- SPDX-License-Identifier: MIT

--- redislock.resty_lock: lua-resty-lock's API (`resty.lock`) over Redis, so
-- that code written for the workers of one nginx excludes across machines.
-- The same methods, options, return values and error strings as
-- lua-resty-lock; one line swaps it in before the code that requires
-- `resty.lock`:
--
--     -- init_by_lua_block (or init_worker_by_lua_block)
--     package.loaded["resty.lock"] = require("redislock.resty_lock")
--     require("redislock.resty_lock").configure{ url = "redis://10.0.0.5:6379" }
--
-- A lock is a redislock lock (Client:acquire) whose TTL is `exptime`; a busy
-- lock is waited for by redislock's wake-ups (a release hands it over), not
-- by lua-resty-lock's sleep steps. The dictionary name is a namespace: the
-- lock on key k of `new("my_locks")` is redislock's lock named
-- "my_locks:" .. k (so different dictionaries stay different locks), and no
-- shared dictionary is needed. What differs (docs/openresty.md): a network
-- round trip per lock, exclusion across every nginx on the Redis, no release
-- by garbage collection (the TTL releases), an `exptime` of 0 refused, and
-- `unlock` or `expire` of a lock that ran out answer `nil, "lost: ..."`.
-- Works in plain Lua too, where `lock` blocks the process while it waits.

local args = require("redislock.args")
local client_mod = require("redislock.client")
local core = require("redislock.core")
local errors = require("redislock.errors")

local getmetatable, pcall, setmetatable, tostring, type = getmetatable, pcall, setmetatable, tostring, type
local math_max, math_min = math.max, math.min
local now, key_problem = core.now, core.key_problem
local error_class, retry = errors.class, errors.retry
local argerror, check_nargs, check_seconds, check_self = args.argerror, args.check_nargs, args.check_seconds,
      args.check_self
local is_client = client_mod.is_client

local _M = { _VERSION = core._VERSION }
local mt = { __index = _M }

args.own(debug.getinfo(1, "S").source)

-- The client configure set (nil: none yet).
local configured

--- Says where Redis is, once for every lock made after it (call it in
-- `init_by_lua*` or `init_worker_by_lua*`; no I/O). A later call replaces it
-- for the locks made after that.
-- @tparam Client|table|string x a redislock client, or the options (or URL)
--   redislock.new takes
-- @treturn Client the client the locks will use
-- @raise "bad argument #1 to 'configure' (...)" for anything else, or
--   options redislock.new refuses
function _M.configure(x, ...)
  check_nargs("configure", 1, ...)
  if is_client(x) then
    configured = x
  elseif type(x) == "table" or type(x) == "string" then
    local ok, c = pcall(client_mod.new, x)
    if not ok then
      local why = tostring(c):match("bad argument #1 to 'new' %((.*)%)$")
      if not why then args.raise_at_caller(tostring(c)) end
      argerror(1, "configure", why)
    end
    configured = c
  else
    argerror(1, "configure", "a redislock client or redislock.new's options expected, got " .. type(x))
  end
  return configured
end

--- The options of new: lua-resty-lock's, and the client.
-- @table resty_lock_options
-- @field exptime seconds the lock lasts unless unlocked or expired again
--   (default 30; the lock's TTL on Redis; more than 0)
-- @field timeout seconds lock waits for a busy lock (default 5; at most
--   exptime; 0: try once)
-- @field step kept for lua-resty-lock's callers, unused: waiting is
--   redislock's wake-ups, not sleep steps
-- @field ratio kept and unused, as step
-- @field max_step kept and unused, as step
-- @field client a redislock client for this lock, instead of configure's
local OPTIONS = { exptime = true, timeout = true, step = true, ratio = true, max_step = true, client = true }
_M.OPTIONS = OPTIONS

-- Option name of opts, checked to be a number (not NaN) when given.
local function number_opt(opts, name)
  local v = opts[name]
  if v ~= nil and (type(v) ~= "number" or v ~= v) then
    argerror(2, "new", "option '" .. name .. "' must be a number, got " .. (v ~= v and "NaN" or type(v)))
  end
  return v
end

--- Makes a lock object (no I/O): `resty_lock:new(dict_name, opts)`, as
-- lua-resty-lock's (`resty_lock.new(dict_name, opts)` is taken too).
-- Options other than resty_lock_options' are ignored, as lua-resty-lock
-- does. The object's fields: `client` (its redislock client), `held` (the
-- redislock lock it holds, or nil: its `fence`, `extend`, `ttl`), `key`
-- (the last key locked), and the options.
-- @param self the module (or a lock object: it makes another)
-- @string dict_name the namespace of its keys (the shared dictionary's name
--   in lua-resty-lock; no dictionary is needed)
-- @tparam[opt] resty_lock_options opts the options
-- @return the lock object
-- @return[2] nil
-- @treturn[2] string "dictionary not found" when dict_name is no non-empty
--   string, or one that cannot begin a lock's name (it starts with "}");
--   "no Redis configured: ..." without configure or opts.client
-- @raise "bad argument #2 to 'new' (...)" for an option of the wrong type
--   or an exptime of 0 or less
function _M.new(self, dict_name, opts, ...)
  if self ~= _M and getmetatable(self) ~= mt then
    dict_name, opts = self, dict_name -- called with '.'
  else
    check_nargs("new", 2, ...)
  end
  -- A name that cannot begin a lock's name ("}...") names no dictionary either.
  if type(dict_name) ~= "string" or dict_name == "" or key_problem(dict_name .. ":") then
    return nil, "dictionary not found"
  end
  if opts ~= nil and type(opts) ~= "table" then argerror(2, "new", "options must be a table, got " .. type(opts)) end
  opts = opts or {}
  local client = opts.client
  if client ~= nil and not is_client(client) then
    argerror(2, "new", "option 'client' must be a redislock client, got " .. type(client))
  end
  client = client or configured
  if not client then
    return nil, 'no Redis configured: call require("redislock.resty_lock").configure(client or options) in '
                .. "init_by_lua or init_worker_by_lua, or pass opts.client"
  end
  local exptime = number_opt(opts, "exptime") or 30
  local ms = check_seconds(2, "new", "option 'exptime'", exptime)
  local timeout = number_opt(opts, "timeout")
  local step = number_opt(opts, "step")
  -- As lua-resty-lock: a timeout is at most exptime, a step at most the timeout.
  if timeout then
    timeout = math_min(timeout, exptime)
    if step then step = math_min(step, timeout) end
  end
  return setmetatable({ client = client, dict_name = dict_name, exptime = exptime, timeout = timeout or 5,
                        step = step or 0.001, ratio = number_opt(opts, "ratio") or 2,
                        max_step = number_opt(opts, "max_step") or 0.5, _ms = ms }, mt)
end

-- Whether a first try's error (a busy lock, a lost connection, a passing
-- server state: what redislock/errors.lua lets a wait retry) is worth
-- waiting out within the timeout.
local function waitable(err)
  return error_class(err) == "busy" or retry(err, "wait")
end

--- Takes the lock on key for exptime seconds, waiting up to timeout
-- seconds while it is busy (woken by its release, not polling).
-- @param self the lock object
-- @string key the key (another value is made a string, as
--   lua-resty-lock does)
-- @treturn number 0 when taken at once, else the seconds waited (more than 0)
-- @return[2] nil
-- @treturn[2] string "timeout" (busy after waiting timeout seconds),
--   "locked" (this object holds a lock already), "nil key", "empty key",
--   "key too long" (over 65535 bytes), or redislock's "connection: ..." or
--   "redis: ..." when Redis cannot be reached or refuses (after trying
--   again within the timeout)
function _M.lock(self, key, ...)
  check_self(self, mt, "lock", "resty_lock object")
  check_nargs("lock", 1, ...)
  if key == nil then return nil, "nil key" end
  if self.held then return nil, "locked" end
  if type(key) ~= "string" then key = tostring(key) end
  if #key == 0 then return nil, "empty key" end
  if #key > 65535 then return nil, "key too long" end
  local client, name, began = self.client, self.dict_name .. ":" .. key, now()
  -- A first try alone tells a lock free at once (0) from one waited for.
  local lock, err = client:acquire(name, self._ms / 1000)
  local waited = false
  if not lock and self.timeout > 0 and waitable(err) then
    local left = self.timeout - (now() - began)
    if left > 0 then
      waited = true
      lock, err = client:acquire(name, self._ms / 1000, { wait = left })
    end
  end
  if not lock then
    if error_class(err) == "busy" then return nil, "timeout" end
    return nil, err
  end
  self.held, self.key = lock, key
  if not waited then return 0 end
  return math_max(now() - began, 0.001)
end

-- The object no longer holds its lock when err says it is not ours.
local function forget_lost(self, err)
  if error_class(err) == "lost" then self.held = nil end
end

--- Releases the lock this object holds (compare-and-delete on Redis).
-- @param self the lock object
-- @treturn number 1
-- @return[2] nil
-- @treturn[2] string "unlocked" (none held), "lost: ..." (it ran out by
--   its TTL, or was taken by force; the object holds none after it), or
--   "connection: ..." / "redis: ..." (it still holds it: try again, or let
--   exptime end it)
function _M.unlock(self, ...)
  check_self(self, mt, "unlock", "resty_lock object")
  check_nargs("unlock", 0, ...)
  local lock = self.held
  if not lock then return nil, "unlocked" end
  local ok, err = lock:release()
  if not ok then
    forget_lost(self, err)
    return nil, err
  end
  self.held = nil
  return 1
end

--- Sets the remaining time of the lock this object holds.
-- @param self the lock object
-- @tparam[opt] number time seconds from now (default: exptime)
-- @treturn boolean true
-- @return[2] nil
-- @treturn[2] string "unlocked" (none held), "lost: ..." (it ran out; the
--   object holds none after it), or "connection: ..." / "redis: ..."
function _M.expire(self, time, ...)
  check_self(self, mt, "expire", "resty_lock object")
  check_nargs("expire", 1, ...)
  local lock = self.held
  if not lock then return nil, "unlocked" end
  if time == nil then time = self._ms / 1000 end
  check_seconds(1, "expire", "time", time)
  local ok, err = lock:extend(time)
  if not ok then
    forget_lost(self, err)
    return nil, err
  end
  return true
end

return _M
