-- SPDX-License-Identifier: MIT

--- redislock: distributed locks on Redis, the public face.
--
-- The lock work (scripts, tokens, I/O) is done by the C core, `redislock.core`;
-- the Lua layer is one module per concern: redislock.client (the client and
-- its transports), redislock.lock (lock objects and leases), redislock.wait
-- (waiting for a busy lock), redislock.scope (with_lock's release on every way
-- out), redislock.args (argument checks and messages), redislock.url, and
-- redislock.ngx (the OpenResty transport). It is plain Lua so that the
-- function run by `with_lock` may yield (coroutines, and cosockets under
-- OpenResty).
--
--     local redislock = require("redislock")
--     local client = redislock.new{ url = "redis://127.0.0.1:6379/0" }
--     client:with_lock("orders:42", 5, function(lock) ... end)

-- The C core first: one built for another Lua (Lua 5.4's, found through a
-- LUA_CPATH that LuaJIT reads too, or the other way round) fails to load
-- with an undefined symbol of the Lua API. Say so.
do
  local ok, err = pcall(require, "redislock.core")
  local symbol = not ok and tostring(err):match("undefined symbol: (luaL?_[%w_]+)")
  if symbol then
    error(string.format("redislock: the C core %s was built for another Lua than this one (%s: no %s). It is "
                        .. "found through package.cpath (LUA_CPATH, which Lua 5.4 and LuaJIT both read): give Lua "
                        .. "5.4 its paths in LUA_PATH_5_4 and LUA_CPATH_5_4, or install each Lua's build in a tree "
                        .. "of its own", tostring(err):match("from file '([^']+)'") or "",
                        rawget(_G, "jit") and jit.version or _VERSION, symbol), 0) -- luacheck: ignore (jit)
  elseif not ok then
    error(err, 0)
  end
end

local args = require("redislock.args")
local client_mod = require("redislock.client")
local core = require("redislock.core")
local errors = require("redislock.errors")

local pcall, tostring = pcall, tostring
local os_getenv = os.getenv

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

--- Makes a client. No I/O: it connects on first use. Under OpenResty it talks
-- over cosockets and nginx's connection pool. The same as
-- redislock.client.new.
-- @function new
-- @tparam[opt] table|string opts the client's options (redislock.client's
--   `client_options`: where Redis is, TLS, timeouts, the key prefix, Sentinel,
--   Cluster or Redlock), or a URL string (`redis://`, `rediss://`, `unix://`);
--   none: 127.0.0.1:6379
-- @treturn Client the client
-- @raise "bad argument #1 to 'new' (...)" for an unknown or malformed option
_M.new = client_mod.new

--- The server replies that acquire and with_lock wait out while they have
-- wait time left (code word -> true): LOADING, BUSY, MASTERDOWN, TRYAGAIN,
-- CLUSTERDOWN.
-- @table TRANSIENT
_M.TRANSIENT = errors.codes("wait")

local default_client

--- The client used by redislock.with_lock: REDIS_URL, else 127.0.0.1:6379.
-- Made on first use, and again after it was closed.
-- @treturn Client the default client
-- @raise "redislock: REDIS_URL is not usable: ..." when REDIS_URL is malformed
function _M.default_client()
  if not default_client or client_mod.closed(default_client) then
    local url = os_getenv("REDIS_URL")
    if url and url ~= "" then
      local ok, c = pcall(_M.new, { url = url })
      if not ok then args.raise_at_caller("redislock: REDIS_URL is not usable: " .. tostring(c)) end
      default_client = c
    else
      default_client = _M.new()
    end
  end
  return default_client
end

--- Calls fn(lock) while holding the lock named key, on the default client
-- (Client:with_lock's guarantees: released on every way out, renewed while
-- fn runs).
-- @tparam string|{string,...} key the lock's name, or a list of names (all or none)
-- @number ttl seconds (fractions allowed); renewed every third of it while fn runs
-- @func fn function(lock): the work
-- @tparam[opt] lock_options opts as Client:acquire's (`wait` ...)
-- @return what fn returned, all of it
-- @raise "busy: ...", "connection: ..." or "redis: ..." when the lock cannot be
--   had; fn's own error, unchanged; "lost: ..." when the lock was no longer ours
function _M.with_lock(key, ttl, fn, opts, ...)
  local ms, how, keys, sorted = client_mod.with_lock_args(key, ttl, fn, opts, ...)
  local client = _M.default_client()
  client_mod.check_open(client, "with_lock")
  return client_mod.with_lock(client, keys, ms, fn, how, sorted)
end

return _M
