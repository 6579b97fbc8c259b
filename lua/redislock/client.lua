-- SPDX-License-Identifier: MIT
--- redislock.client: the client. `new` checks the connection options and
-- connects (lazily) through redislock.transport. A client takes locks
-- (acquire, with_lock), makes lock objects from tokens, and runs plain
-- commands. It is past 400 lines because every public method of a client
-- is here, each a checked entry to the module that does the work (the
-- other primitives, redislock/admin.lua's operator calls): one place for a
-- user to read what a client offers.

local args = require "redislock.args"
local core = require "redislock.core"
local lock_mod = require "redislock.lock"
local scope = require "redislock.scope"
local tls = require "redislock.tls"
local topology = require "redislock.topology"
local transport = require "redislock.transport"
local url = require "redislock.url"
local wait = require "redislock.wait"

local error, pairs, select, setmetatable, tostring, type = error, pairs, select, setmetatable, tostring, type
local string_format = string.format
local token, now, getpid, fork_gen = core.token, core.now, core.getpid, core.fork_gen
local os_time = os.time
local observe = lock_mod.observe
local take, note_taken = wait.take, scope.note_taken
local argerror, raise_at_caller, quote, pack = args.argerror, args.raise_at_caller, args.quote, args.pack
local check_key, check_seconds, check_self, check_nargs, check_opts, check_whole, check_phase, lock_opts =
      args.check_key, args.check_seconds, args.check_self, args.check_nargs, args.check_opts, args.check_whole,
      args.check_phase, args.lock_opts

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

local Client = {}
local client_mt = { __index = Client }

--- Whether x is a client (of redislock.new).
function _M.is_client(x)
  return getmetatable(x) == client_mt
end

--- Whether the client was closed.
function _M.closed(client)
  return client._link.closed
end

-- Refuses a client that was closed.
local function check_not_closed(client, fname)
  if client._link.closed then
    raise_at_caller(string_format("bad self to '%s' (client is closed)", fname))
  end
end

-- Refuses a client that was closed, and I/O where nginx forbids it.
local function check_open(client, fname)
  check_not_closed(client, fname)
  check_phase(client._transport, fname)
end
_M.check_open = check_open

-- check_self for clients, refusing closed ones, for calls that do no I/O
-- (allowed in any nginx phase; what they make checks its own).
local function check_live(self, fname)
  check_self(self, client_mt, fname, "redislock client")
  check_not_closed(self, fname)
end

-- check_self for clients, refusing closed ones too.
local function check_client(self, fname)
  check_live(self, fname)
  check_phase(self._transport, fname)
end

local CSTRING_OPTS = args.CSTRING_OPTS
local MAX_TIMEOUT_MS = 86400 * 1000

local NEW_OPTS = {
  url = true, host = true, port = true, path = true, username = true, password = true,
  db = true, connect_timeout = true, timeout = true, prefix = true, tls = true,
  pool_size = true, keepalive_timeout = true,
  sentinels = true, master = true, sentinel_username = true, sentinel_password = true, sentinel_tls = true,
  cluster = true, redlock = true, label = true, holder = true, observer = true,
}
local STRING_OPTS = { "url", "host", "path", "username", "password", "prefix", "master", "sentinel_username",
                      "sentinel_password", "label" }

-- The characters of a holder's host and label in a token (no '/', no space).
local HOLDER_CHARS = "[^%w%._:@%-]"

--- Makes a client. No I/O: it connects on first use. Under OpenResty it talks
-- over cosockets and nginx's connection pool (see redislock/ngx.lua).
-- @param opts table (or a URL string): url, host, port, path, username, password,
--   db, connect_timeout, timeout (seconds), prefix (default "lock:"), tls
--   (true, or { ca, cert, key, server_name, verify }: redislock/tls.lua); under
--   OpenResty also pool_size and keepalive_timeout (seconds) for setkeepalive;
--   behind Sentinel, sentinels and master instead of url, host,
--   port and path, and sentinel_username, sentinel_password, sentinel_tls for
--   the sentinels (redislock/sentinel.lua); for Redis Cluster, cluster (a
--   list of seed nodes) instead of url, host, port and path
--   (redislock/cluster.lua); for Redlock, redlock (a list of at least 3
--   independent servers, URLs or tables) instead of url, host, port and path
--   (redislock/redlock.lua); label (a name for this holder in the locks'
--   tokens, see client:inspect), holder (false: tokens without who holds
--   them), observer (function(event, info), see redislock/lock.lua's observe)
-- @return client
function _M.new(opts, ...)
  check_nargs("new", 1, ...)
  if type(opts) == "string" then opts = { url = opts } end
  opts = check_opts(1, "new", opts, NEW_OPTS)
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
  if c.port ~= nil then check_whole(1, "new", "option 'port'", c.port, 1, 65535) end
  if c.db ~= nil then
    check_whole(1, "new", opts.db ~= nil and "option 'db'" or "the URL's database", c.db, 0, 1000000)
  end
  if c.username and not c.password then
    argerror(1, "new", "option 'username' needs a 'password'")
  end
  if c.host == "" or c.path == "" then
    argerror(1, "new", "options 'host' and 'path' must not be empty")
  end
  for _, name in pairs(CSTRING_OPTS) do
    if c[name] and c[name]:find("\0", 1, true) then
      argerror(1, "new", string_format("option '%s' must not contain NUL bytes", name))
    end
  end
  if opts.pool_size ~= nil then check_whole(1, "new", "option 'pool_size'", opts.pool_size, 1, 1000000) end
  c.pool_size = opts.pool_size
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
  c.tls = tls.settings(opts.tls, c.tls, c.path)
  c.prefix = opts.prefix or "lock:"
  local why = core.prefix_problem(c.prefix)
  if why then argerror(1, "new", "option 'prefix' " .. why) end
  -- _renewed: its locks with a lease, weakly (close stops their renewal).
  -- _held: key -> its lock taken by this client, weakly (for messages).
  -- _hot: keys this client found busy lately (redislock/wait.lua).
  -- _link: shared with its locks, which read whether it was closed.
  -- _holder: "/<host>/" for the tokens (nil: holder = false), _label: "/<label>" or "".
  local self = { prefix = c.prefix, _renewed = setmetatable({}, { __mode = "k" }),
                 _held = setmetatable({}, { __mode = "v" }), _hot = { keys = {}, n = 0 },
                 _link = { closed = false, observer = opts.observer, prefix = c.prefix },
                 _holder = opts.holder ~= false and "/" .. core.hostname():gsub(HOLDER_CHARS, "_") .. "/" or nil,
                 _label = opts.label and "/" .. opts.label or "" }
  self._transport, self._sleep = topology.transport(opts, c)
  self._link.sleep, self._link.timeout = self._sleep, (c.timeout_ms or 1000) / 1000 -- the transports' default
  return setmetatable(self, client_mt)
end

-- Lua 5.4 `local client <close> = redislock.new(...)`: closed at scope exit.
client_mt.__close = function(self)
  self:close()
end

client_mt.__tostring = function(self)
  return tostring(self._transport)  -- "redislock.Client (127.0.0.1:6379)"
end

-- Commands that would change what the connection means for the lock scripts
-- sent after them: another db, a transaction, a subscription, no replies,
-- another user. Client:command refuses them.
local STATEFUL = {
  SELECT = true, MULTI = true, EXEC = true, DISCARD = true, WATCH = true, UNWATCH = true,
  SUBSCRIBE = true, PSUBSCRIBE = true, SSUBSCRIBE = true, UNSUBSCRIBE = true,
  PUNSUBSCRIBE = true, SUNSUBSCRIBE = true, MONITOR = true, RESET = true, HELLO = true,
  AUTH = true, QUIT = true, SYNC = true, PSYNC = true,
}

--- Runs one Redis command on the client's connection, e.g. for a fenced write.
-- Arguments are strings or numbers. A nil reply is false. Commands that would
-- change the connection's state (SELECT, MULTI, SUBSCRIBE, AUTH ...) are refused.
-- @return the reply (string, integer, false or table), or nil and
--   "connection: ..." / "redis: <server error>"
function Client:command(name, ...)
  check_client(self, "command")
  if name == nil then argerror(1, "command", "command name expected") end
  local argv = pack(name, ...)
  for i = 1, argv.n do
    local t = type(argv[i])
    if t ~= "string" and t ~= "number" then
      argerror(i, "command", "string or number expected, got " .. t)
    end
  end
  if type(name) == "string" then
    local upper = name:upper()
    local sub = select("#", ...) > 0 and type((...)) == "string" and (...):upper()
    if STATEFUL[upper] or (upper == "CLIENT" and sub == "REPLY") then
      argerror(1, "command", quote(name) .. " would change the connection's state under the locks;"
                             .. " use the client's options, or another Redis client")
    end
  end
  return self._transport:command(name, ...)
end

--- Closes the client's connection for good; later calls on it raise.
function Client:close(...)
  check_self(self, client_mt, "close", "redislock client")
  check_nargs("close", 0, ...)
  -- Its locks are no longer renewed: they run out by their TTL.
  for lock in pairs(self._renewed) do lock_mod.stop_lease(lock) end
  self._transport:close()
  self._link.closed = true
end


------------------------------------------------------------------------------
-- Locks

-- Raises a bad argument n to fname for an acquire option the client's
-- topology cannot honour (Redlock: fair, replicas).
local function refused(self, n, fname, how)
  args.refuse(n, fname, how, self._transport.refuses, "with 'redlock'")
end

-- Makes the lock object for a hold just taken (fence: its fence; sent:
-- core.now() when the successful attempt was sent) and, with how.renew,
-- starts its renewal; notes it for messages and with_lock's scope.
local function adopt(self, key, tok, fence, sent, ms, how, scoped, kind)
  local t = self._transport
  -- The lock cannot expire on the server before sent + ms (the TTL started
  -- after the send), by the monotonic clock.
  local lock = lock_mod.new(t, self._link, key, tok, fence, sent + (t.validity_ms and t:validity_ms(ms) or ms) / 1000,
                            kind and kind.ops)
  lock._since = sent
  if how.renew then
    lock_mod.lease(lock, how, ms, sent, scoped)
    self._renewed[lock] = true
  end
  if not kind then
    self._held[key] = lock
    lock._context = transport.context()
  elseif kind.note then
    kind.note(self, key, lock)
  end
  if scope.watching > 0 then note_taken(lock) end
  return lock
end
_M.adopt = adopt

--- A new token for a hold by client self: 32 random hex digits, then who
-- holds it (unless holder = false): /<host>/<pid>/<since, unix seconds>[/<label>].
-- The part after the digits is made again only when the second or the
-- process (a fork) changed: it costs the cycle next to nothing.
local function new_token(self)
  local holder = self._holder
  if not holder then return token() end
  local gen, t = fork_gen(), os_time()
  if gen ~= self._gen or t ~= self._second then
    self._gen, self._second = gen, t
    self._suffix = holder .. getpid() .. "/" .. t .. self._label
  end
  return token(self._suffix)
end
_M.new_token = new_token

-- acquire after its arguments were checked. scoped: with_lock's lock, which
-- must not outlive the running thread (see redislock/ngx_lease.lua); kind:
-- how to take it (wait.take's; nil for a lock).
--- Tells the client's observer how a take that began at began (core.now())
-- ended: "acquired" (fence, and sent: when the successful try was sent) or
-- "busy" (sent: the message); other failures are not its business.
local function observe_take(self, began, key, kind, fence, sent)
  if fence then
    observe(self._link, "acquired", { key = key, kind = kind, fence = fence, wait = sent - began })
  elseif sent:find("^busy:") then
    observe(self._link, "busy", { key = key, kind = kind, waited = now() - began, why = sent })
  end
end
_M.observe_take = observe_take

local function acquire(self, key, ms, how, scoped, kind)
  local tok, t = new_token(self), self._transport
  local began = self._link.observer and now()
  local fence, sent, acked, werr = take(t, self._sleep, self._held, self._hot, key, tok, ms, how, kind)
  if began then observe_take(self, began, key, kind and kind.ops.kind or "lock", fence, sent) end
  if not fence then return nil, sent end
  if how.replicas and (not acked or acked < how.replicas) then
    lock_mod.new(t, self._link, key, tok, nil, nil, kind and kind.ops):release() -- give it back
    if not acked then return nil, werr end -- taken, but the WAIT failed
    -- not durable enough to count as taken
    return nil, string_format("redis: %s reached %d of %d replica%s within %.3g s (WAIT), so it was released",
                              kind and kind.ops.label:format(quote(key)) or quote(key), acked, how.replicas,
                              how.replicas == 1 and "" or "s", how.replica_ms / 1000)
  end
  return adopt(self, key, tok, fence, sent, ms, how, scoped, kind)
end

--- hold(client, key, ms, how, scoped, kind) -> hold | nil, err: takes
-- key as kind says (redislock/wait.lua's kind, with ops: the hold's scripts,
-- redislock/lock.lua's), waiting, renewing and noting it as a lock; for
-- the primitives (redislock/semaphore.lua, redislock/rwlock.lua).
_M.hold = acquire

--- with_hold(client, key, ms, how, kind, fn): with_lock for any hold:
-- takes it (kind nil: a lock), or raises why not; then fn(hold) under
-- scope.hold (released on every way out, fn's results or error passed on).
function _M.with_hold(self, key, ms, how, kind, fn)
  local h, err = acquire(self, key, ms, how, true, kind)
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

--- The name of the era record of the slot of the lock on key, as the C core
-- makes it ("<prefix>{<tag>}:era": rl_script.c, "Fences across failovers").
function _M.era_name(client, key)
  return client.prefix .. "{" .. core.era_tag(core.lock_slot(key)) .. "}:era"
end

-- Raises a bad argument n to fname when the client's topology cannot run
-- the primitive called what ("a semaphore" ...).
local function check_primitive(self, n, fname, what)
  local no = self._transport.refuses
  if no and no.primitives then
    argerror(n, fname, string_format("%s is not available with 'redlock' (%s)", what, no.primitives))
  end
end

-- A multi-key lock's keys (argument n of fname), checked: the keys as
-- given, and sorted (redislock/multilock.lua).
local function multi_keys(n, fname, keys)
  return require("redislock.multilock").check_keys(n, fname, keys)
end

--- Takes the lock named key for ttl seconds; with a list of keys, all of
-- them or none (redislock/multilock.lua).
-- @param key string, the lock's name (stored as prefix .. "{" .. key .. "}"),
--   or a list of names
-- @param ttl seconds (fractions allowed): the lock expires by itself after it
-- @param opts optional table: wait (seconds to keep trying; default 0, try once)
-- @return lock, or nil and "busy: ...", "connection: ..." or "redis: ..."
function Client:acquire(key, ttl, opts, ...)
  check_client(self, "acquire")
  if type(key) == "table" then
    local keys, sorted = multi_keys(1, "acquire", key)
    local ms = check_seconds(2, "acquire", "ttl", ttl)
    local how = lock_opts(3, "acquire", opts, false)
    check_nargs("acquire", 3, ...)
    local multilock = require "redislock.multilock"
    multilock.check_how(3, "acquire", how)
    return multilock.acquire(self, keys, sorted, ms, how, false)
  end
  check_key(1, "acquire", key)
  local ms = check_seconds(2, "acquire", "ttl", ttl)
  local how = lock_opts(3, "acquire", opts, false)
  check_nargs("acquire", 3, ...)
  refused(self, 3, "acquire", how)
  return acquire(self, key, ms, how)
end

--- A lock object for a lock taken elsewhere, known by its key and token (a
-- lock service hands the token to its caller, who later sends it back to
-- release). release, extend and ttl compare the token on the server as usual;
-- the fence is unknown (nil).
-- @param key string, the lock's name
-- @param tok the lock's token: 32 hex digits, as lock.token
-- @return lock
function Client:from_token(key, tok, ...)
  check_live(self, "from_token")
  check_key(1, "from_token", key)
  if type(tok) ~= "string" then
    argerror(2, "from_token", "token must be a string, got " .. type(tok))
  elseif #tok < 32 or tok:sub(1, 32):find("[^0-9a-f]") or (#tok > 32 and not tok:find("^/[^%s%z]+$", 33)) then
    argerror(2, "from_token", "token must be 32 lowercase hex digits (and who holds it, after a '/'), as lock.token")
  end
  check_nargs("from_token", 2, ...)
  -- Neither its fence nor when it expires is known here.
  return lock_mod.new(self._transport, self._link, key, tok)
end


------------------------------------------------------------------------------
-- with_lock

--- The arguments of with_lock (the method's and the module function's),
-- checked; returns the ttl in ms, how to take and hold the lock, and for a
-- list of keys, the keys sorted (the key passed on is then the checked copy).
function _M.with_lock_args(key, ttl, fn, opts, ...)
  local sorted
  if type(key) == "table" then key, sorted = multi_keys(1, "with_lock", key) else check_key(1, "with_lock", key) end
  local ms = check_seconds(2, "with_lock", "ttl", ttl)
  args.check_fn(3, "with_lock", fn)
  local how = lock_opts(4, "with_lock", opts, true)
  check_nargs("with_lock", 4, ...)
  if sorted then require("redislock.multilock").check_how(4, "with_lock", how) end
  return ms, how, key, sorted
end

--- with_lock after its arguments were checked (sorted: a multi-key lock's
-- keys, sorted; key then the list).
function _M.with_lock(self, key, ms, fn, how, sorted)
  if not sorted then return _M.with_hold(self, key, ms, how, nil, fn) end
  local lock, err = require("redislock.multilock").acquire(self, key, sorted, ms, how, true)
  if not lock then error(err, 0) end
  return scope.hold(lock, fn)
end

--- Calls fn(lock) while holding the lock named key, then releases it.
-- Returns exactly what fn returned. Raises "busy: ..." or "connection: ..." when
-- the lock cannot be taken, fn's own error value (unchanged) when fn raises, and
-- "lost: ..." when the lock was no longer ours at release.
-- @param opts optional table: wait (seconds to keep trying to acquire)
function Client:with_lock(key, ttl, fn, opts, ...)
  check_client(self, "with_lock")
  local ms, how, keys, sorted = _M.with_lock_args(key, ttl, fn, opts, ...)
  refused(self, 4, "with_lock", how)
  return _M.with_lock(self, keys, ms, fn, how, sorted)
end


------------------------------------------------------------------------------
-- The other primitives: each a module of its own, loaded on first use.

-- The checks every primitive's maker starts with: a live client that can
-- run it (not Redlock), and its name (argument 1 of fname, as a key).
local function check_maker(self, fname, name, what)
  check_live(self, fname)
  check_key(1, fname, name)
  check_primitive(self, 1, fname, what)
end

--- A counting semaphore named name: at most limit permits held at once
-- (redislock/semaphore.lua). No I/O.
function Client:semaphore(name, ...)
  check_maker(self, "semaphore", name, "a semaphore")
  return require("redislock.semaphore").new(self, name, ...)
end

--- A read-write lock named name: many readers or one writer
-- (redislock/rwlock.lua). No I/O.
function Client:rwlock(name, ...)
  check_maker(self, "rwlock", name, "a read-write lock")
  return require("redislock.rwlock").new(self, name, ...)
end


------------------------------------------------------------------------------
-- For operators (redislock/admin.lua)

--- What the server says of the lock named key: a table { held (boolean),
-- ttl (seconds left), fence (the last one handed out), token, holder = {
-- host, pid, since (unix seconds), label } (who holds it, from its token) }.
-- @return table, or nil and "connection: ..." / "redis: ..."
function Client:inspect(key, ...)
  check_client(self, "inspect")
  check_key(1, "inspect", key)
  check_nargs("inspect", 1, ...)
  return require("redislock.admin").inspect(self, key)
end

--- Releases the lock named key whoever holds it (for operators: a holder
-- that is gone, a job stuck). Wakes one waiter; fences keep growing, so the
-- old holder's fenced writes are refused after the next holder's.
-- @return true (it was held), false (it was free), or nil and "connection: ..." / "redis: ..."
function Client:force_release(key, ...)
  check_client(self, "force_release")
  check_key(1, "force_release", key)
  check_nargs("force_release", 1, ...)
  return require("redislock.admin").force_release(self, key)
end

return _M
