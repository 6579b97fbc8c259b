-- SPDX-License-Identifier: MIT
--- redislock.client_args: what a client takes, checked: redislock.new's
-- options, once, into the fields of the connection a transport makes (its
-- address, timeouts, TLS, prefix) and the observer; and which commands
-- Client:command refuses. redislock/client.lua documents the options and
-- calls these; the checks of the lock options and of each server's address
-- are redislock/args.lua's.

local args = require("redislock.args")
local core = require("redislock.core")
local metrics = require("redislock.metrics")
local multilock = require("redislock.multilock")
local tls = require("redislock.tls")
local topology = require("redislock.topology")
local url = require("redislock.url")

local pairs, type = pairs, type
local string_format = string.format
local argerror, check_opts, check_seconds, check_whole = args.argerror, args.check_opts, args.check_seconds,
      args.check_whole

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

local MAX_TIMEOUT_MS = 86400 * 1000

local STRING_OPTS = { "url", "host", "path", "username", "password", "prefix", "master", "sentinel_username",
                      "sentinel_password", "label" }

-- The characters of a holder's host and label in a token (no '/', no space).
local HOLDER_CHARS = "[^%w%._:@%-]"

--- options(opts, names) -> c, opts, observer, holder: redislock.new's
-- options (opts, a table; names: the option names it takes), checked,
-- raising a bad argument #1 to 'new' for any it refuses. c: the
-- connection's fields (host, port or path, username, password, db,
-- pool_size, wait_connections, *_timeout_ms, tls, prefix), as
-- topology.transport takes them; opts: the options (as args.check_opts
-- gives them back); observer: the observer events go to (metrics' before
-- opts.observer), or nil; holder: "/<host>/" for the tokens (nil: holder =
-- false).
function _M.options(opts, names)
  opts = check_opts(1, "new", opts, names)
  for _, name in pairs(STRING_OPTS) do
    if opts[name] ~= nil and type(opts[name]) ~= "string" then
      argerror(1, "new", string_format("option '%s' must be a string, got %s", name, type(opts[name])))
    end
  end
  topology.check(opts)
  local c = {}
  if opts.url then
    local t, why = url.parse(opts.url)
    if not t then argerror(1, "new", "option 'url' " .. why) end
    -- A URL names a TCP address or a socket path; host or path may replace
    -- its own kind of address, not the other one.
    if opts.path and t.host or opts.host and t.path then
      argerror(1, "new", string_format("option '%s' cannot replace the address of a %s URL in option 'url'",
                                       opts.path and "path" or "host", t.path and "unix://" or "redis://"))
    end
    c = t
  end
  for _, name in pairs({ "host", "port", "path", "username", "password", "db" }) do
    if opts[name] ~= nil then c[name] = opts[name] end
  end
  if opts.host and opts.path then
    argerror(1, "new", "options 'host' and 'path' exclude each other")

  elseif opts.host then
    c.path = nil
  elseif opts.path then
    c.host, c.port = nil, nil
  end
  args.check_server(c, function(field)
    if field == "db" and opts.db == nil then return "the URL's database" end
    return "option '" .. field .. "'"
  end)
  for _, name in pairs({ "pool_size", "wait_connections" }) do
    if opts[name] ~= nil then check_whole(1, "new", "option '" .. name .. "'", opts[name], 1, 1000000) end
    c[name] = opts[name]
  end
  if opts.coalesce ~= nil and type(opts.coalesce) ~= "boolean" then
    argerror(1, "new", "option 'coalesce' must be a boolean, got " .. type(opts.coalesce))
  end
  for _, name in pairs({ "connect_timeout", "timeout", "keepalive_timeout" }) do
    if opts[name] ~= nil then
      local ms = check_seconds(1, "new", "option '" .. name .. "'", opts[name])
      if ms > MAX_TIMEOUT_MS then
        argerror(1, "new", string_format("option '%s' must be at most 86400 (one day)", name))
      end
      c[name .. "_ms"] = ms
    end
  end
  if opts.label ~= nil and (#opts.label == 0 or #opts.label > 64 or opts.label:find(HOLDER_CHARS)) then
    argerror(1, "new", "option 'label' must be 1 to 64 letters, digits or . _ : @ -")
  end
  if opts.holder ~= nil and type(opts.holder) ~= "boolean" then
    argerror(1, "new", "option 'holder' must be a boolean, got " .. type(opts.holder))
  end
  if opts.observer ~= nil and not args.is_callable(opts.observer) then
    argerror(1, "new", "option 'observer' must be a function, got " .. type(opts.observer))
  end
  local observer = opts.observer
  if opts.metrics ~= nil then
    if not metrics.is_metrics(opts.metrics) then
      argerror(1, "new", "option 'metrics' must be made by redislock.metrics.new, got " .. type(opts.metrics))
    end
    observer = opts.metrics:observer(observer)
  end
  c.tls = tls.settings(opts.tls, c.tls, c.path)
  c.prefix = opts.prefix or "lock:"
  local why = core.prefix_problem(c.prefix)
  if why then argerror(1, "new", "option 'prefix' " .. why) end
  return c, opts, observer, opts.holder ~= false and "/" .. core.hostname():gsub(HOLDER_CHARS, "_") .. "/" or nil
end

--- Raises a bad argument n to fname (a method of client self) for an
-- acquire option the client's topology cannot honour (Redlock: fair,
-- replicas).
function _M.refused(self, n, fname, how)
  args.refuse(n, fname, how, self._transport.refuses, "with 'redlock'")
end

--- Raises a bad argument n to fname when the topology of client self
-- cannot run the primitive called what ("a semaphore" ...).
function _M.check_primitive(self, n, fname, what)
  local no = self._transport.refuses
  if no and no.primitives then
    argerror(n, fname, string_format("%s is not available with 'redlock' (%s)", what, no.primitives))
  end
end

--- Raises a bad argument n to fname unless tok is a lock's token: 32
-- lowercase hex digits, and who holds it after a '/' (Client:from_token).
function _M.check_token(n, fname, tok)
  if type(tok) ~= "string" then
    argerror(n, fname, "token must be a string, got " .. type(tok))
  elseif #tok < 32 or tok:sub(1, 32):find("[^0-9a-f]") or (#tok > 32 and not tok:find("^/[^%s%z]+$", 33)) then
    argerror(n, fname, "token must be 32 lowercase hex digits (and who holds it, after a '/'), as lock.token")
  end
end

-- Commands that would change what the connection means for the lock scripts
-- sent after them: another db, a transaction, a subscription, no replies,
-- another user. Client:command refuses them (in capitals).
_M.STATEFUL = {
  SELECT = true, MULTI = true, EXEC = true, DISCARD = true, WATCH = true, UNWATCH = true,
  SUBSCRIBE = true, PSUBSCRIBE = true, SSUBSCRIBE = true, UNSUBSCRIBE = true,
  PUNSUBSCRIBE = true, SUNSUBSCRIBE = true, MONITOR = true, RESET = true, HELLO = true,
  AUTH = true, QUIT = true, SYNC = true, PSYNC = true,
}

--- Raises: argument i of command, v, is neither a string nor a number.
function _M.bad_argument(i, v)
  argerror(i, "command", "string or number expected, got " .. type(v))
end

--- upper_of[name]: a command name in capitals, remembered by upper_name for
-- the first 256 short names seen, so that the usual few cost no new string
-- a call.
local upper_of, uppers = {}, 0
_M.upper_of = upper_of
function _M.upper_name(name)
  local upper = name:upper()
  if uppers < 256 and #name <= 32 then upper_of[name], uppers = upper, uppers + 1 end
  return upper
end

-- The arguments of with_lock (the client's method's and the module
-- function's), checked; returns the ttl in ms, how to take and hold the
-- lock, and for a list of keys, the keys sorted (the key passed on is then
-- the checked copy).
function _M.with_lock_args(key, ttl, fn, opts, ...)
  local sorted
  if type(key) == "table" then
    key, sorted = multilock.check_keys(1, "with_lock", key)
  else
    args.check_key(1, "with_lock", key)
  end
  local ms = check_seconds(2, "with_lock", "ttl", ttl)
  args.check_fn(3, "with_lock", fn)
  local how = args.lock_opts(4, "with_lock", opts, true)
  args.check_nargs("with_lock", 4, ...)
  if sorted then multilock.check_how(4, "with_lock", how) end
  return ms, how, key, sorted
end

return _M
