-- SPDX-License-Identifier: MIT

--- redislock.client: the client, and every method a user calls on it.
-- `new` checks the connection options and
-- connects (lazily) through redislock.transport. A client takes locks
-- (acquire, with_lock), makes lock objects from tokens, and runs plain
-- commands: every public method of a client is here, each a checked entry
-- to the module that does the work (redislock/hold.lua's machinery, the
-- other primitives, redislock/admin.lua's operator calls): one place for a
-- user to read what a client offers.

local admin = require("redislock.admin")
local args = require("redislock.args")
local client_args = require("redislock.client_args")
local core = require("redislock.core")
local election = require("redislock.election")
require("redislock.guard") -- adds the guarded writes to lock objects (fenced, owned)
local hold = require("redislock.hold")
local lock_mod = require("redislock.lock")
local multilock = require("redislock.multilock")
local rwlock = require("redislock.rwlock")
local scope = require("redislock.scope")
local semaphore = require("redislock.semaphore")
local topology = require("redislock.topology")
local transport = require("redislock.transport")

local error, pairs, select, setmetatable, tostring, type =
      error, pairs, select, setmetatable, tostring, type
local argerror, quote, pack = args.argerror, args.quote, args.pack
local check_key, check_seconds, check_self, check_nargs, lock_opts =
      args.check_key, args.check_seconds, args.check_self, args.check_nargs, args.lock_opts
local STATEFUL, bad_argument, upper_of, upper_name = client_args.STATEFUL, client_args.bad_argument,
      client_args.upper_of, client_args.upper_name
local acquire, with_hold = hold.hold, hold.with_hold
local check_keys = multilock.check_keys -- a multi-key lock's: the keys as given, and sorted
local refused, check_primitive = client_args.refused, client_args.check_primitive
local FAST, fast_take, taken = hold.FAST, core.fast_take, hold.taken
local fast_with, with_taken = core.fast_with, hold.with_taken
local check_live, check_client = hold.check_live, hold.check_client

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

local client_mt = hold.client_mt
local Client = client_mt.__index
_M.is_client, _M.closed, _M.check_open = hold.is_client, hold.closed, hold.check_open

--- The options of redislock.new. Times are seconds (fractions allowed).
-- Behind Sentinel, `sentinels` and `master` replace `url`, `host`, `port`
-- and `path`; so do `cluster` and `redlock`.
-- @table client_options
-- @field url `redis://[user:password@]host[:port][/db]`, `rediss://...`
--   (TLS) or `unix:///path[?db=N&password=P&username=U]`; other options
--   override its parts
-- @field host the server's address (default "127.0.0.1")
-- @field port its TCP port (default 6379; 1 to 65535)
-- @field path a unix socket path, instead of host and port
-- @field username the Redis 6 ACL user for AUTH (docs/connecting.md)
-- @field password the password for AUTH
-- @field db the database SELECTed after connecting (default 0)
-- @field connect_timeout seconds to connect (default 1; at most 86400)
-- @field timeout seconds to wait for each reply (default 1; at most 86400)
-- @field prefix the lock named k is the Redis key prefix .. "{k}" (default
--   "lock:"; no braces)
-- @field tls true (verified against the system's store), or a table of
--   `tls_options`; on by default for `rediss://`
-- @field pool_size OpenResty: the most connections a worker opens for its
--   calls and keeps (default 30)
-- @field keepalive_timeout OpenResty: seconds an idle pooled connection is
--   kept (default: nginx's lua_socket_keepalive_timeout)
-- @field wait_connections OpenResty: the most connections a worker blocks
--   on while waiting for busy locks (default 2); a waiter beyond them polls
-- @field coalesce OpenResty: false makes every waiting request of a worker
--   wait on Redis itself (default true: one waits for all, per lock)
-- @field sentinels Sentinel: a list of sentinels, "host:port" strings or
--   { host =, port = } tables (docs/sentinel.md)
-- @field master Sentinel: the name of the master the sentinels watch
-- @field sentinel_username Sentinel: the sentinels' ACL user
-- @field sentinel_password Sentinel: the sentinels' password
-- @field sentinel_tls Sentinel: TLS to the sentinels (true or `tls_options`)
-- @field cluster Redis Cluster: a list of seed nodes, as `sentinels`
--   (docs/cluster.md)
-- @field redlock Redlock: a list of 3 or more independent servers, URLs or
--   tables of these options (docs/redlock.md)
-- @field label a name for this holder, put in its locks' tokens (1 to 64
--   letters, digits or `. _ : @ -`): Client:inspect shows it
-- @field holder false: tokens without who holds them (host, pid, since)
-- @field observer function(event, info), called at every hold's acquire,
--   busy, release and loss, for metrics (docs/operations.md)
-- @field metrics a redislock.metrics object (redislock.metrics.new) that
--   counts this client's holds, for Prometheus (docs/operations.md); its
--   observer runs before `observer`, if both are given
local NEW_OPTS = {
  url = true, host = true, port = true, path = true, username = true, password = true,
  db = true, connect_timeout = true, timeout = true, prefix = true, tls = true,
  pool_size = true, keepalive_timeout = true, wait_connections = true, coalesce = true,
  sentinels = true, master = true, sentinel_username = true, sentinel_password = true, sentinel_tls = true,
  cluster = true, redlock = true, label = true, holder = true, observer = true,
  metrics = true,
}
--- The `tls` option's table (redislock/tls.lua checks it).
-- @table tls_options
-- @field ca a file of CA certificates (PEM) to verify the server with
--   (default: the system's trust store)
-- @field cert a client certificate (PEM), with `key`
-- @field key the client certificate's private key (PEM)
-- @field server_name the name sent (SNI) and verified (default: the host)
-- @field verify false: do not verify the server's certificate (default true)

--- The options of Client:acquire, Client:with_lock and the other
-- primitives' acquire and with_ forms.
-- @table lock_options
-- @field wait seconds to keep trying (default 0: try once)
-- @field wait_mode "notify" (default: block until a release hands over or
--   wakes this waiter) or "poll" (retry with jittered backoff)
-- @field fair true: waiters get the lock in the order they arrived
-- @field handoff false: a release wakes this waiter instead of handing it
--   the lock (default true; not with fair)
-- @field renew renew the lock every third of its TTL while held (default
--   true in with_lock, false in acquire)
-- @field max_hold seconds after which renewal stops; the lock then runs out
--   by its TTL
-- @field on_lost function(lock, err), called once when the lock is found
--   lost (plain Lua: it may raise, to abort with_lock's fn)
-- @field replicas after acquiring, wait (Redis WAIT) until this many
--   replicas have the lock
-- @field replica_timeout seconds to wait for them (default 1); if they do
--   not all answer, the lock is released and acquire fails
-- @field lock_delay seconds (0 to 86400; default 0) that a hold lost
--   without a release (its holder died, or paused past its TTL) keeps
--   others out after its TTL: the server keeps it TTL + lock_delay, its
--   holder counts it lost at its TTL; a release ends it at once
--   (docs/guarantees.md). Not with Redlock, multi-key locks or elections

--- Makes a client (redislock.new). No I/O: it connects on first use. Under
-- OpenResty it talks over cosockets and nginx's connection pool.
-- @tparam[opt] client_options|string opts the options, or a URL string
--   (`redis://`, `rediss://`, `unix://`); none: 127.0.0.1:6379
-- @treturn Client the client
-- @raise "bad argument #1 to 'new' (...)" for an unknown or malformed option
function _M.new(opts, ...)
  check_nargs("new", 1, ...)
  if type(opts) == "string" then opts = { url = opts } end
  local c, observer, holder
  c, opts, observer, holder = client_args.options(opts, NEW_OPTS)
  -- _renewed: its locks with a lease, weakly (close stops their renewal).
  -- _held: key -> its lock taken by this client, weakly (for messages).
  -- _hot: keys this client found busy lately (redislock/wait.lua).
  -- _waiting: the runtime's waiting strategy (redislock/wait.lua's take):
  -- under OpenResty the gates where waiters of one nginx worker queue
  -- (redislock/ngx_gate.lua); nil in plain Lua, or with coalesce = false.
  -- _link: shared with its locks, which read whether it was closed.
  -- _token: makes its holds' tokens (core.tokens; the C client's own: client:holder).
  local label = opts.label and "/" .. opts.label or ""
  local self = { prefix = c.prefix, _renewed = setmetatable({}, { __mode = "k" }),
                 _held = setmetatable({}, { __mode = "v" }), _hot = { keys = {}, n = 0 },
                 _link = { closed = false, observer = observer, prefix = c.prefix },
                 _token = core.tokens(holder, label) }
  self._transport, self._sleep = topology.transport(opts, c)
  -- One server in plain Lua (the C client), no observer: acquire's and
  -- with_lock's common case is one call (core.fast_take, core.fast_with).
  if observer == nil and type(self._transport) == "userdata" then
    FAST[self] = self._transport
    self._transport:holder(holder, label)
  end
  self._waiting = opts.coalesce ~= false and transport.waiting and transport.waiting() or nil
  -- (the transports' defaults)
  self._link.sleep, self._link.timeout = self._sleep, (c.timeout_ms or 1000) / 1000
  self._link.connect_timeout = (c.connect_timeout_ms or 1000) / 1000
  return setmetatable(self, client_mt)
end

-- Lua 5.4 `local client <close> = redislock.new(...)`: closed at scope exit.
client_mt.__close = function(self)
  self:close()
end

client_mt.__tostring = function(self)
  return tostring(self._transport)  -- "redislock.Client (127.0.0.1:6379)"
end

--- Runs one Redis command on the client's connection, e.g. for a fenced write.
-- Arguments are strings or numbers. A nil reply is false. Commands that would
-- change the connection's state (SELECT, MULTI, SUBSCRIBE, AUTH ...) are refused.
-- @string name the command, e.g. "GET"
-- @param ... its arguments, strings or numbers
-- @return the reply (string, integer, false or table)
-- @return[2] nil
-- @treturn[2] string "connection: ..." or "redis: <server error>"
function Client:command(name, ...)
  check_client(self, "command")
  if name == nil then argerror(1, "command", "command name expected") end
  local kind = type(name)
  if kind ~= "string" and kind ~= "number" then bad_argument(1, name) end
  local n = select("#", ...)
  local argv = n > 8 and pack(...) -- one table beats select's walk over many arguments
  for i = 1, n do
    local v
    if argv then v = argv[i] else v = select(i, ...) end
    local t = type(v)
    if t ~= "string" and t ~= "number" then bad_argument(i + 1, v) end
  end
  if kind == "string" then
    local upper = upper_of[name] or upper_name(name)
    if STATEFUL[upper] or (upper == "CLIENT" and n > 0 and type((...)) == "string" and (...):upper() == "REPLY") then
      argerror(1, "command", quote(name) .. " would change the connection's state under the locks;"
                             .. " use the client's options, or another Redis client")
    end
  end
  return self._transport:command(name, ...)
end

--- Closes the client's connection for good; later calls on it raise. Its
-- locks are not released (their renewal stops; they run out by their TTL).
-- Also the client's `__close` (a to-be-closed variable, Lua 5.4).
-- @return nothing
function Client:close(...)
  check_self(self, client_mt, "close", "redislock client")
  check_nargs("close", 0, ...)
  -- Its locks are no longer renewed: they run out by their TTL.
  for lock in pairs(self._renewed) do lock_mod.stop_lease(lock) end
  self._transport:close()
  self._link.closed = true
end


-- ----------------------------------------------------------------------------
-- Locks

--- Takes the lock named key for ttl seconds; with a list of keys, all of
-- them or none (redislock/multilock.lua).
-- @tparam string|{string,...} key the lock's name (stored as prefix .. "{" ..
--   key .. "}"), or a list of names
-- @number ttl seconds (fractions allowed): the lock expires by itself after it
-- @tparam[opt] lock_options opts how to wait and hold (`wait`: seconds to keep
--   trying; default 0, try once)
-- @treturn redislock.lock.Lock the lock (a redislock.multilock.MultiLock for a list)
-- @return[2] nil
-- @treturn[2] string "busy: ...", "connection: ..." or "redis: ..."
function Client:acquire(key, ttl, opts, ...)
  -- The common case (one server, no observer; a key and a TTL, nothing
  -- more) in one call: core.fast_take checks it all, makes the token and
  -- sends the take (hold.taken reads its answer); nothing for any other.
  -- (with_lock's: core.fast_with, then hold.with_taken.)
  local t = FAST[self]
  if t then
    local fence, tok, a, b, left = fast_take(t, key, ttl, opts, ...)
    if fence ~= nil then return taken(self, t, key, fence, tok, a, b, left) end
  end
  check_client(self, "acquire")
  if type(key) == "table" then
    local keys, sorted = check_keys(1, "acquire", key)
    local ms = check_seconds(2, "acquire", "ttl", ttl)
    local how = lock_opts(3, "acquire", opts, false)
    check_nargs("acquire", 3, ...)
    multilock.check_how(3, "acquire", how)
    return multilock.acquire(self, keys, sorted, ms, how)
  end
  check_key(1, "acquire", key)
  local ms = check_seconds(2, "acquire", "ttl", ttl)
  local how = lock_opts(3, "acquire", opts, false)
  if select("#", ...) > 0 then check_nargs("acquire", 3, ...) end
  if self._transport.refuses then refused(self, 3, "acquire", how) end
  return acquire(self, key, ms, how)
end

--- A lock object for a lock taken elsewhere, known by its key and token (a
-- lock service hands the token to its caller, who later sends it back to
-- release). release, extend and ttl compare the token on the server as usual;
-- the fence is unknown (nil).
-- @string key the lock's name
-- @string tok the lock's token, as lock.token was
-- @treturn redislock.lock.Lock a lock object (fence nil)
function Client:from_token(key, tok, ...)
  check_live(self, "from_token")
  check_key(1, "from_token", key)
  client_args.check_token(2, "from_token", tok)
  check_nargs("from_token", 2, ...)
  -- Neither its fence nor when it expires is known here.
  return lock_mod.new(self._transport, self._link, key, tok)
end


-- ----------------------------------------------------------------------------
-- with_lock

-- The arguments of with_lock (the method's and the module function's),
-- checked (redislock/client_args.lua).
_M.with_lock_args = client_args.with_lock_args

-- with_lock after its arguments were checked (sorted: a multi-key lock's
-- keys, sorted; key then the list).
function _M.with_lock(self, key, ms, fn, how, sorted)
  if not sorted then return with_hold(self, key, ms, how, nil, fn) end
  local lock, err = multilock.acquire(self, key, sorted, ms, how)
  if not lock then error(err, 0) end
  return scope.hold(lock, fn)
end

--- Calls fn(lock) while holding the lock named key, then releases it.
-- Returns exactly what fn returned. Raises "busy: ..." or "connection: ..." when
-- the lock cannot be taken, fn's own error value (unchanged) when fn raises, and
-- "lost: ..." when the lock was no longer ours at release.
-- @tparam string|{string,...} key the lock's name, or a list of names (all or none)
-- @number ttl seconds: renewed every third of it while fn runs
-- @func fn function(lock): the work; it may yield
-- @tparam[opt] lock_options opts as acquire's (`wait`: seconds to keep trying)
-- @return what fn returned, all of it
function Client:with_lock(key, ttl, fn, opts, ...)
  local t = FAST[self]
  if t then
    local fence, tok, a, b, lease, ms = fast_with(t, key, ttl, fn, opts, ...)
    if fence ~= nil then return with_taken(self, t, key, fn, fence, tok, a, b, lease, ms) end
  end
  check_client(self, "with_lock")
  local ms, how, keys, sorted = _M.with_lock_args(key, ttl, fn, opts, ...)
  refused(self, 4, "with_lock", how)
  return _M.with_lock(self, keys, ms, fn, how, sorted)
end


-- ----------------------------------------------------------------------------
-- The other primitives: each a module of its own.

-- The checks every primitive's maker starts with: a live client that can
-- run it (not Redlock), and its name (argument 1 of fname, as a key).
local function check_maker(self, fname, name, what)
  check_live(self, fname)
  check_key(1, fname, name)
  check_primitive(self, 1, fname, what)
end

--- The election named name: campaign, leader, observe, with_leadership
-- (redislock/election.lua). No I/O.
-- @string name the election's name (its lock is "election:" .. name)
-- @treturn redislock.election.Election the election
function Client:election(name, ...)
  check_live(self, "election")
  return election.new(self, name, ...)
end

--- A counting semaphore named name: at most limit permits held at once
-- (redislock/semaphore.lua). No I/O.
-- @string name the semaphore's name
-- @int limit how many permits may be held at once (1 or more)
-- @treturn redislock.semaphore.Semaphore the semaphore
function Client:semaphore(name, ...)
  check_maker(self, "semaphore", name, "a semaphore")
  return semaphore.new(self, name, ...)
end

--- A read-write lock named name: many readers or one writer
-- (redislock/rwlock.lua). No I/O.
-- @string name the read-write lock's name
-- @treturn redislock.rwlock.RWLock the read-write lock
function Client:rwlock(name, ...)
  check_maker(self, "rwlock", name, "a read-write lock")
  return rwlock.new(self, name, ...)
end


-- ----------------------------------------------------------------------------
-- For operators (redislock/admin.lua)

--- What the server says of the lock named key: a table { held (boolean),
-- ttl (seconds left), fence (the last one handed out), token, holder = {
-- host, pid, since (unix seconds), label } (who holds it, from its token) }.
-- @string key the lock's name
-- @treturn table what the server says
-- @return[2] nil
-- @treturn[2] string "connection: ..." or "redis: ..."
function Client:inspect(key, ...)
  check_client(self, "inspect")
  check_key(1, "inspect", key)
  check_nargs("inspect", 1, ...)
  return admin.inspect(self, key)
end

--- Releases the lock named key whoever holds it (for operators: a holder
-- that is gone, a job stuck). Wakes one waiter; fences keep growing, so the
-- old holder's fenced writes are refused after the next holder's.
-- @string key the lock's name
-- @treturn boolean true (it was held) or false (it was free)
-- @return[2] nil
-- @treturn[2] string "connection: ..." or "redis: ..."
function Client:force_release(key, ...)
  check_client(self, "force_release")
  check_key(1, "force_release", key)
  check_nargs("force_release", 1, ...)
  return admin.force_release(self, key)
end

_M.OPTIONS = NEW_OPTS -- the names of new's options (spec/40 holds the reference against them)

return _M
