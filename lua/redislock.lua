-- SPDX-License-Identifier: MIT
--- redislock: distributed locks on Redis.
--
-- The lock work (scripts, tokens, I/O) is done by the C core, `redislock.core`;
-- this file is the API people call. It is plain Lua so that the function run by
-- `with_lock` may yield (coroutines, and cosockets under OpenResty).
--
--     local redislock = require "redislock"
--     local client = redislock.new{ url = "redis://127.0.0.1:6379/0" }
--     client:with_lock("orders:42", 5, function(lock) ... end)

local core = require "redislock.core"

local collectgarbage, error, getmetatable, ipairs, next, pairs, pcall, rawget, select, setmetatable, tonumber,
      tostring, type =
      collectgarbage, error, getmetatable, ipairs, next, pairs, pcall, rawget, select, setmetatable, tonumber,
      tostring, type
local string_format, string_char = string.format, string.char
local math_max, math_min, math_floor = math.max, math.min, math.floor
local os_getenv = os.getenv
local coroutine_running = coroutine.running
local debug_getinfo, debug_gethook, debug_sethook = debug.getinfo, debug.gethook, debug.sethook
local unpack = table.unpack or unpack  -- luacheck: ignore (LuaJIT)
local now, token, to_ms, key_problem = core.now, core.token, core.ms, core.key_problem

-- Under ngx_lua (OpenResty) Redis I/O goes over cosockets: redislock/ngx.lua.
local ngx = rawget(_G, "ngx")
local ngx_transport = type(ngx) == "table" and type(ngx.socket) == "table" and ngx.get_phase
  and require "redislock.ngx"

local _M = { _VERSION = core._VERSION }

-- Backoff while waiting for a busy lock: jittered, doubling, capped, and never
-- past the caller's deadline nor (much) past the holder's expiry.
local FIRST_STEP, MAX_STEP = 0.002, 0.128

local Client = {}
local client_mt = { __index = Client }
local Lock = {}
local lock_mt = { __index = Lock }

local function pack(...)
  return { n = select("#", ...), ... }
end

local HERE = debug_getinfo(1, "S").source

-- Raises msg with the position of the first caller outside this file, so that
-- argument errors point at the user's line however deep the check sits.
local function raise_at_caller(msg)
  local level = 2
  while true do
    local info = debug_getinfo(level, "S")
    if not info or info.source ~= HERE then break end
    level = level + 1
  end
  error(msg, level)
end

-- Raises "bad argument #n to 'fname' (msg)".
local function argerror(n, fname, msg)
  raise_at_caller(string_format("bad argument #%d to '%s' (%s)", n, fname, msg))
end

-- Keys (and other user strings) in messages are cut to this many bytes.
local MAX_SHOWN = 64

local ESCAPES = { ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t", ['"'] = '\\"', ["\\"] = "\\\\" }
local function escape(c)
  return ESCAPES[c] or string_format("\\x%02x", c:byte())
end

-- Whether s is UTF-8 text (for messages only: overlong forms pass).
local function is_utf8(s)
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    local len = c < 0x80 and 1 or (c >= 0xC2 and c <= 0xDF) and 2 or (c >= 0xE0 and c <= 0xEF) and 3
                or (c >= 0xF0 and c <= 0xF4) and 4 or nil
    if not len then return false end
    for j = i + 1, i + len - 1 do
      local b = s:byte(j)
      if not b or b < 0x80 or b > 0xBF then return false end
    end
    i = i + len
  end
  return true
end

-- A string as it appears in messages: quoted, control bytes escaped (and
-- every byte over 127 when it is not UTF-8 text), cut to about MAX_SHOWN
-- bytes (on a character's edge) with its full length after it.
local function quote(s)
  local shown = s
  if #s > MAX_SHOWN then
    local cut = MAX_SHOWN
    while cut > 1 and (s:byte(cut + 1) or 0) >= 0x80 and s:byte(cut + 1) <= 0xBF do cut = cut - 1 end
    shown = s:sub(1, cut)
  end
  local bytes = is_utf8(shown) and "[%c\"\\]" or "[%c\"\\\128-\255]"
  shown = '"' .. shown:gsub(bytes, escape) .. '"'
  if #s > MAX_SHOWN then shown = string_format("%s... (%d bytes)", shown, #s) end
  return shown
end

-- A value as it appears in messages: strings quoted, anything else as tostring.
local function show(v)
  if type(v) == "string" then return quote(v) end
  return tostring(v)
end

local function check_key(n, fname, key)
  if type(key) ~= "string" then
    argerror(n, fname, "key must be a string, got " .. type(key))
  end
  local why = key_problem(key)
  if why then argerror(n, fname, why) end
end

-- Seconds (a Lua number) to integer milliseconds, or raise naming `what`.
local function check_seconds(n, fname, what, value)
  if type(value) ~= "number" then
    argerror(n, fname, string_format("%s must be a number, got %s", what, type(value)))
  end
  local ms, why = to_ms(value)
  if not ms then argerror(n, fname, what .. " " .. why) end
  return ms
end

local function check_self(self, mt, fname, what)
  if getmetatable(self) ~= mt then
    raise_at_caller(string_format("bad self to '%s' (%s expected, got %s; call it with ':', as x:%s(...))",
                                  fname, what, type(self), fname))
  end
end

-- Refuses arguments past the last one fname takes (luaposix's checknargs).
local function check_nargs(fname, max, ...)
  local extra = select("#", ...)
  if extra > 0 then
    argerror(max + 1, fname, string_format("no more than %d argument%s expected, got %d",
                                           max, max == 1 and "" or "s", max + extra))
  end
end

-- Refuses I/O in an nginx phase where cosockets are not available (blocking
-- there would stall the worker). A misuse found by the first test of the
-- code, not a condition to handle at run time, so it raises like a bad
-- argument rather than return nil, err.
local function check_phase(client, fname)
  local t = client._transport
  local phase = t.io_problem and t:io_problem()
  if phase then
    raise_at_caller(string_format("redislock: '%s' cannot run in nginx's %s phase: cosockets are not"
      .. " available there; call it from rewrite, access, content or a timer (ngx.timer.at)", fname, phase))
  end
end

-- Refuses a client that was closed, and I/O where nginx forbids it.
local function check_open(client, fname)
  if client._transport:closed() then
    raise_at_caller(string_format("bad self to '%s' (client is closed)", fname))
  end
  check_phase(client, fname)
end

-- check_self for clients, refusing closed ones too.
local function check_client(self, fname)
  check_self(self, client_mt, fname, "redislock client")
  check_open(self, fname)
end

-- Refuses anything but nil or a table whose keys are all in `known`.
local function check_opts(n, fname, opts, known)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    argerror(n, fname, "options must be a table, got " .. type(opts))
  end
  for k in pairs(opts) do
    if not known[k] then
      argerror(n, fname, "unknown option " .. show(k))
    end
  end
  return opts
end

local function is_whole(v, lo, hi)
  return type(v) == "number" and v == math_floor(v) and v >= lo and v <= hi
end

local function is_callable(f)
  local mt = getmetatable(f)
  return type(f) == "function" or (type(mt) == "table" and mt.__call ~= nil)
end

local ACQUIRE_OPTS = {
  wait = true, wait_mode = true, fair = true, renew = true, max_hold = true, on_lost = true,
  replicas = true, replica_timeout = true,
}
local WAIT_MODES = { notify = true, poll = true }

-- The options of acquire and with_lock, checked; returns how to take and
-- hold the lock: { wait = seconds, mode = "notify" | "poll", fair = boolean,
-- renew = boolean (default `renew`), max_hold_ms, on_lost, replicas,
-- replica_ms }.
local DEFAULT_HOW = {
  [false] = { wait = 0, mode = "notify", fair = false, renew = false },
  [true] = { wait = 0, mode = "notify", fair = false, renew = true },
}

local function check_acquire_opts(n, fname, opts, renew)
  if opts == nil then return DEFAULT_HOW[renew] end -- shared, never changed
  opts = check_opts(n, fname, opts, ACQUIRE_OPTS)
  local how = { wait = opts.wait or 0, mode = opts.wait_mode or "notify", fair = opts.fair or false }
  if opts.renew ~= nil then renew = opts.renew end
  if type(renew) ~= "boolean" then
    argerror(n, fname, "option 'renew' must be a boolean, got " .. type(renew))
  end
  how.renew = renew
  if opts.max_hold ~= nil then
    how.max_hold_ms = check_seconds(n, fname, "option 'max_hold'", opts.max_hold)
  end
  if opts.on_lost ~= nil and not is_callable(opts.on_lost) then
    argerror(n, fname, "option 'on_lost' must be a function, got " .. type(opts.on_lost))
  end
  how.on_lost = opts.on_lost
  for _, name in ipairs({ "max_hold", "on_lost" }) do
    if opts[name] ~= nil and not renew then
      argerror(n, fname, string_format("option '%s' needs renewal (renew = true)", name))
    end
  end
  if opts.replicas ~= nil then
    if not is_whole(opts.replicas, 1, 1000000) then
      argerror(n, fname, "option 'replicas' must be a whole number >= 1")
    end
    how.replicas = opts.replicas
    how.replica_ms = opts.replica_timeout == nil and 1000
      or check_seconds(n, fname, "option 'replica_timeout'", opts.replica_timeout)
  elseif opts.replica_timeout ~= nil then
    argerror(n, fname, "option 'replica_timeout' needs 'replicas'")
  end
  local wait = how.wait
  if type(wait) ~= "number" or wait ~= wait or wait < 0 or wait * 1000 > core.MAX_MS then
    argerror(n, fname, "option 'wait' must be a number of seconds in 0..9007199254740.992 (2^53 ms)")
  end
  if not WAIT_MODES[how.mode] then
    argerror(n, fname, "option 'wait_mode' must be \"notify\" or \"poll\", got " .. show(how.mode))
  end
  if type(how.fair) ~= "boolean" then
    argerror(n, fname, "option 'fair' must be a boolean, got " .. type(how.fair))
  end
  return how
end

------------------------------------------------------------------------------
-- Connection options and URLs

local function unescape(s)
  return (s:gsub("%%(%x%x)", function(h) return string_char(tonumber(h, 16)) end))
end

local function url_db(s)
  if s == nil or s == "" then return nil end
  local db = s:match("^%d+$") and tonumber(s)
  if not db then return nil, "has a database that is not a whole number: " .. quote(s) end
  return db
end

-- Parses redis://[user:password@]host[:port][/db] and unix:///path[?db=N].
-- Returns a table of connection fields, or nil and why.
local function parse_url(url)
  local scheme, rest = url:match("^(%a[%w+.-]*)://(.*)$")
  scheme = scheme and scheme:lower()
  if scheme == "rediss" then
    return nil, "uses rediss:// (TLS), which this build does not support (hiredis 0.14 has no TLS)"
  elseif scheme == "unix" then
    local path, query = rest:match("^([^?]*)%??(.*)$")
    if path:sub(1, 1) ~= "/" then
      return nil, "needs an absolute path, as in unix:///run/redis.sock"
    end
    local t = { path = unescape(path) }
    for pair in query:gmatch("[^&]+") do
      local k, v = pair:match("^([^=]*)=(.*)$")
      if k == "db" then
        local db, why = url_db(v)
        if not db then return nil, why or "has an empty db parameter" end
        t.db = db
      elseif k == "password" or k == "username" then
        t[k] = unescape(v)
      else
        return nil, "has an unknown parameter " .. quote(k or pair)
      end
    end
    return t
  elseif scheme ~= "redis" then
    return nil, "must start with redis:// or unix://, got " .. quote(url)
  end
  local authority, tail = rest:match("^([^/?#]*)(.*)$")
  local t = {}
  local userinfo, hostport = authority:match("^(.*)@(.*)$")
  if userinfo then
    local user, pass = userinfo:match("^([^:]*):(.*)$")
    if not user then
      return nil, "needs a ':' before the password, as in redis://:secret@host or redis://user:secret@host"
    end
    if user ~= "" then t.username = unescape(user) end
    if pass ~= "" then t.password = unescape(pass) end
  else
    hostport = authority
  end
  local host, port = hostport:match("^%[([^%]]+)%]:?(%d*)$")
  if not host then host, port = hostport:match("^([^:]*):?(%d*)$") end
  if not host then return nil, "has a host and port that cannot be read: " .. quote(hostport) end
  if host ~= "" then t.host = host end
  if port ~= "" then t.port = tonumber(port) end
  local db = tail:match("^/(%d*)$")
  if not db and tail ~= "" then
    return nil, "must end in /<db number> after the host, got " .. quote(tail)
  end
  local why
  t.db, why = url_db(db)
  if why then return nil, why end
  return t
end

local CSTRING_OPTS = { "host", "path", "username", "password" }
local MAX_TIMEOUT_MS = 86400 * 1000

local NEW_OPTS = {
  url = true, host = true, port = true, path = true, username = true, password = true,
  db = true, connect_timeout = true, timeout = true, prefix = true,
  pool_size = true, keepalive_timeout = true,
}
local STRING_OPTS = { "url", "host", "path", "username", "password", "prefix" }

--- Makes a client. No I/O: it connects on first use. Under OpenResty it talks
-- over cosockets and nginx's connection pool (see redislock/ngx.lua).
-- @param opts table (or a URL string): url, host, port, path, username, password,
--   db, connect_timeout, timeout (seconds), prefix (default "lock:"); under
--   OpenResty also pool_size and keepalive_timeout (seconds) for setkeepalive
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
  local c = {}
  if opts.url then
    local t, why = parse_url(opts.url)
    if not t then argerror(1, "new", "option 'url' " .. why) end
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
  if c.port ~= nil and not is_whole(c.port, 1, 65535) then
    argerror(1, "new", "option 'port' must be a whole number in 1..65535")
  end
  if c.db ~= nil and not is_whole(c.db, 0, 1000000) then
    argerror(1, "new", "option 'db' must be a whole number >= 0")
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
  if opts.pool_size ~= nil and not is_whole(opts.pool_size, 1, 1000000) then
    argerror(1, "new", "option 'pool_size' must be a whole number >= 1")
  end
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
  c.prefix = opts.prefix or "lock:"
  local why = core.prefix_problem(c.prefix)
  if why then argerror(1, "new", "option 'prefix' " .. why) end
  -- _renewed: its locks with a lease, weakly (close stops their renewal).
  -- _held: key -> its lock taken by this client, weakly (for messages).
  local self = { prefix = c.prefix, _renewed = setmetatable({}, { __mode = "k" }),
                 _held = setmetatable({}, { __mode = "v" }) }
  if ngx_transport then
    self._transport, self._sleep = ngx_transport.new(c), ngx.sleep
  else
    c.pool_size, c.keepalive_timeout_ms = nil, nil -- one connection per client
    self._transport, self._sleep = core.new(c), core.sleep
  end
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
  local args = pack(name, ...)
  for i = 1, args.n do
    local t = type(args[i])
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

local stop_lease -- (locks, below)

--- Closes the client's connection for good; later calls on it raise.
function Client:close(...)
  check_self(self, client_mt, "close", "redislock client")
  check_nargs("close", 0, ...)
  -- Its locks are no longer renewed: they run out by their TTL.
  for lock in pairs(self._renewed) do stop_lease(lock) end
  self._transport:close()
end

------------------------------------------------------------------------------
-- Acquire, with waiting

local function jitter()
  return 0.5 + tonumber(token():sub(1, 6), 16) / 0x2000000
end

local function seconds_text(ms)
  if ms < 0 then return "no expiry set" end
  return string_format("%.3g s left", ms / 1000)
end

-- How late Redis may end a BLPOP that timed out (seconds): it checks the
-- timeouts of blocked clients at its tick, hz = 10 by default.
local BLPOP_SLACK = 0.1

-- A fair waiter comes back at least this often (seconds), so that the queue
-- keeps it: the server drops one that stays away 3 s (RL_FAIR_STAY_MS).
local FAIR_STEP = 1

-- Whole milliseconds, at least 1, for a wait of s seconds.
local function wait_ms(s)
  return math_max(1, math_floor(s * 1000 + 0.5))
end

local expires_of -- (locks, below)

-- Whether client holds key itself, as far as it knows (not released, not
-- found lost, and its TTL cannot have run out).
local function held_here(client, key)
  local lock = client._held[key]
  return lock ~= nil and lock._state == "held" and now() < (expires_of(lock) or math.huge)
end

-- The busy message after an attempt that answered value (the holder's PTTL,
-- or -2 when a fair lock is free but promised to earlier waiters); mine: the
-- holder is this very client.
local function busy_message(key, value, waited, mine)
  local state, detail = "held by another owner", seconds_text(value)
  if value == -2 then
    state, detail = "promised to earlier waiters", "fair queue"
  elseif mine then
    state, detail = "held by this client", "locks are not reentrant; " .. detail
  end
  if waited > 0 then
    return string_format("busy: %s is still %s after waiting %.3g s (%s)", quote(key), state, waited, detail)
  end
  return string_format("busy: %s is %s (%s)", quote(key), state, detail)
end

-- Replies that mean "this server will answer later": a restart loading its
-- data (LOADING), a script running (BUSY), a replica cut off from its master
-- (MASTERDOWN), a cluster slot moving or a cluster without quorum (TRYAGAIN,
-- CLUSTERDOWN). With wait time left they are retried like a lost connection;
-- every lock script checks the token, so a resend is always reconciled. The
-- one list of them: topologies add theirs here.
local TRANSIENT = { LOADING = true, BUSY = true, MASTERDOWN = true, TRYAGAIN = true, CLUSTERDOWN = true }
_M.TRANSIENT = TRANSIENT

-- Whether an error message (from eval) is worth retrying within the wait:
-- a connection failure or a transient server state.
local function retryable(err)
  if err:sub(1, 11) == "connection:" then return true end
  local code = err:match("^redis: (%u+)")
  return code ~= nil and TRANSIENT[code] == true
end

-- Tries to take key with token until how.wait seconds have passed. Between
-- attempts it blocks on the lock's wake-up list (mode "notify": release
-- wakes one waiter, and a block never outlasts the holder's TTL or the
-- deadline), or sleeps a jittered, doubling step (mode "poll", and after a
-- connection error). A fair waiter queues on the server and leaves the queue
-- when it gives up. The same token is resent after a connection error: the
-- acquire scripts treat "the key already holds my token" as success, so a
-- send that landed is not counted twice.
-- Returns the fence, the time the successful attempt was sent and (with
-- how.replicas) how many replicas acknowledged it, or nil and why the WAIT
-- failed; or nil and an error message.
local function take(self, key, tok, ms, how)
  local c, sleep = self._transport, self._sleep
  local wait, fair = how.wait, how.fair
  local op = fair and "acquire_fair" or "acquire"
  local deadline = now() + wait
  local step = FIRST_STEP
  while true do
    local sent = now()
    local status, value, acked, werr = c:eval(op, key, tok, ms, how.replicas, how.replica_ms)
    if status == 1 then return value, sent, acked, werr end
    local left = deadline - now()
    if left <= 0 or (status == nil and not retryable(value)) then
      if fair then c:eval("leave", key, tok) end -- best effort: else it drops out in 3 s
      if status == nil then return nil, value end
      return nil, busy_message(key, value, wait, held_here(self, key))
    end
    -- How long the lock can stay as it is: until the holder's TTL runs out.
    local block = left
    if status == -1 and value >= 0 then block = math_min(block, value / 1000 + 0.001) end
    if fair then block = math_min(block, FAIR_STEP) end
    if status == nil or how.mode == "poll" then
      -- At least 1 ms: nginx's timers have millisecond resolution, and
      -- ngx.sleep(0) only yields.
      sleep(math_max(math_min(step * jitter(), block), 0.001))
      step = math_min(step * 2, MAX_STEP)
    elseif block > 1.5 * BLPOP_SLACK then
      -- Redis ends a BLPOP that timed out only at its next tick (10 a second
      -- by default): block that much less, and sleep what is left near the end.
      if c:wait(key, fair and tok or nil, wait_ms(block - BLPOP_SLACK)) == nil then
        sleep(math_max(math_min(step * jitter(), block), 0.001)) -- the wait failed: back off
        step = math_min(step * 2, MAX_STEP)
      end
    else
      -- Near the holder's expiry or the deadline: short backoff steps, so
      -- that a release meanwhile is not slept through.
      sleep(math_max(math_min(step * jitter(), block), 0.001))
      step = math_min(step * 2, MAX_STEP)
    end
  end
end

local lease_lost, note_taken -- (below)

-- acquire after its arguments were checked. scoped: with_lock's lock, which
-- must not outlive the running thread (see redislock/ngx.lua).
local function acquire(self, key, ms, how, scoped)
  local tok = token()
  local fence, sent, acked, werr = take(self, key, tok, ms, how)
  if not fence then return nil, sent end
  -- _expires: the lock cannot expire on the server before this (the TTL
  -- started after the send), by the monotonic clock.
  local lock = setmetatable({ key = key, token = tok, fence = fence, _client = self, _state = "held",
                              _expires = sent + ms / 1000 }, lock_mt)
  if how.replicas and not acked then
    lock:release() -- taken, but the WAIT failed: give it back
    return nil, werr
  elseif how.replicas and acked < how.replicas then
    lock:release() -- not durable enough to count as taken
    return nil, string_format("redis: %s reached %d of %d replica%s within %.3g s (WAIT), so it was released",
                              quote(key), acked, how.replicas, how.replicas == 1 and "" or "s",
                              how.replica_ms / 1000)
  end
  if how.renew then
    local lease, err = self._transport:lease(key, tok, ms, how.max_hold_ms, math_floor(sent * 1000), scoped)
    if not lease then
      lock:release()
      error("redislock: " .. err, 0) -- the watchdog thread could not start, or out of memory
    end
    lock._lease, lock._on_lost = lease, how.on_lost
    self._renewed[lock] = true
    -- Under OpenResty the renewal timer reports a loss as it finds it.
    if ngx_transport then lease.on_lost = function() lease_lost(lock) end end
  end
  self._held[key] = lock
  note_taken(self, lock)
  return lock
end

--- Takes the lock named key for ttl seconds.
-- @param key string, the lock's name (stored as prefix .. "{" .. key .. "}")
-- @param ttl seconds (fractions allowed): the lock expires by itself after it
-- @param opts optional table: wait (seconds to keep trying; default 0, try once)
-- @return lock, or nil and "busy: ...", "connection: ..." or "redis: ..."
function Client:acquire(key, ttl, opts, ...)
  check_client(self, "acquire")
  check_key(1, "acquire", key)
  local ms = check_seconds(2, "acquire", "ttl", ttl)
  local how = check_acquire_opts(3, "acquire", opts, false)
  check_nargs("acquire", 3, ...)
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
  -- No I/O here: allowed in any nginx phase (the lock's methods check theirs).
  check_self(self, client_mt, "from_token", "redislock client")
  if self._transport:closed() then
    raise_at_caller("bad self to 'from_token' (client is closed)")
  end
  check_key(1, "from_token", key)
  if type(tok) ~= "string" then
    argerror(2, "from_token", "token must be a string, got " .. type(tok))
  elseif #tok ~= 32 or tok:find("[^0-9a-f]") then
    argerror(2, "from_token", "token must be 32 lowercase hex digits, as lock.token")
  end
  check_nargs("from_token", 2, ...)
  -- No _expires: when it expires is not known here.
  return setmetatable({ key = key, token = tok, _client = self, _state = "held" }, lock_mt)
end

------------------------------------------------------------------------------
-- Locks

-- Stops the lock's renewal, if any, keeping in _expires when the lock runs
-- out by the last renewal.
stop_lease = function(self)
  local lease = self._lease
  if not lease then return end
  self._expires = lease:expires() or self._expires
  lease:stop()
end

-- The latest time (core.now()) the lock may last to, or nil when unknown.
expires_of = function(self)
  local lease = self._lease
  return lease and lease:expires() or self._expires
end

-- Records that the lock is no longer ours (why: a sentence fragment), stops
-- its renewal, calls its on_lost once, and returns the "lost" message.
local function set_lost(self, why)
  self._state = "lost"
  self._lost = string_format("lost: %s is no longer ours (%s)", quote(self.key), why)
  stop_lease(self)
  local on_lost = self._on_lost
  if on_lost then
    self._on_lost = nil
    on_lost(self, self._lost) -- may raise, to abort the work
  end
  return self._lost
end

-- The "lost" message after a script answered status (0 or -1) at op.
local function mark_lost(self, status, op)
  local why = status == -1 and "another owner holds it now" or "it expired or was deleted"
  return set_lost(self, why .. "; found at " .. op)
end

-- The "lost" message when the lock's renewal found it lost, else nil.
lease_lost = function(self)
  local lease = self._lease
  if not lease or self._state ~= "held" then return nil end
  local state, why = lease:state()
  if state ~= "lost" then return nil end
  return set_lost(self, why)
end

-- The "connection" message when the lock's client was closed, else nil.
-- Close is no release: the lock runs out by its TTL.
local function client_closed(self)
  if not self._client._transport:closed() then return nil end
  return string_format("connection: the lock's client is closed; %s runs out by its TTL", quote(self.key))
end

-- The "lost" message when the lock is not ours by our own account (released,
-- or found lost, by us or by its renewal), else nil.
local function no_longer_ours(self)
  if self._state == "released" then
    return string_format("lost: %s was already released", quote(self.key))
  end
  lease_lost(self)
  if self._state == "lost" then return self._lost end
  return nil
end

-- Runs op on the server for a lock that is still ours by our own account;
-- fname names the public method for errors.
-- Returns the script's value, or nil and an error message.
local function lock_eval(self, fname, op, ms)
  check_phase(self._client, fname)
  local gone = no_longer_ours(self) or client_closed(self)
  if gone then return nil, gone end
  -- Stopped first, so that no renewal runs after the release.
  if op == "release" then stop_lease(self) end
  local sent = now()
  local status, value = self._client._transport:eval(op, self.key, self.token, ms)
  if status == nil then
    -- A release that went out but whose answer did not come back may have
    -- run on the server (not so when the connection could not even be made).
    if op == "release" and value:match("^connection:") and not value:match("^connection: cannot connect") then
      self._release_unconfirmed = true
    end
    return nil, value
  end
  if status ~= 1 then
    -- The key is gone before the lock could have expired: that earlier,
    -- unanswered release did land, and left it as this one would have.
    if status == 0 and op == "release" and self._release_unconfirmed and now() < (expires_of(self) or 0) then
      return 0
    end
    return nil, mark_lost(self, status, op)
  end
  if op == "extend" then
    self._expires = sent + ms / 1000
    if self._lease then self._lease:extended(ms, math_floor(sent * 1000)) end
  end
  return value
end

--- Releases the lock if it is still ours (compare-and-delete on the server).
-- Releasing again is harmless and returns true.
-- @return true, or nil and "lost: ..." / "connection: ..." / "redis: ..."
function Lock:release(...)
  check_self(self, lock_mt, "release", "redislock lock")
  check_nargs("release", 0, ...)
  if self._state == "released" then return true end
  local ok, err = lock_eval(self, "release", "release")
  if not ok then return nil, err end
  self._state = "released"
  return true
end

--- Sets the lock's remaining time to ttl seconds, if it is still ours.
-- @return true, or nil and "lost: ..." / "connection: ..." / "redis: ..."
function Lock:extend(ttl, ...)
  check_self(self, lock_mt, "extend", "redislock lock")
  local ms = check_seconds(1, "extend", "ttl", ttl)
  check_nargs("extend", 1, ...)
  local ok, err = lock_eval(self, "extend", "extend", ms)
  if not ok then return nil, err end
  return true
end

--- Remaining time of the lock in seconds, if it is still ours.
-- @return seconds, or nil and "lost: ..." / "connection: ..." / "redis: ..."
function Lock:ttl(...)
  check_self(self, lock_mt, "ttl", "redislock lock")
  check_nargs("ttl", 0, ...)
  local ms, err = lock_eval(self, "ttl", "pttl")
  if not ms then return nil, err end
  return ms / 1000
end

--- Whether the lock is still ours: true, or nil and "lost: ...". Cheap: it
-- looks at what the renewal (watchdog) found and, without renewal, at whether
-- the TTL can have run out; with server = true it also asks the server.
-- @return true, or nil and "lost: ..." (or "connection: ..." / "redis: ..." when asking the server)
function Lock:check(server, ...)
  check_self(self, lock_mt, "check", "redislock lock")
  if server ~= nil and type(server) ~= "boolean" then
    argerror(1, "check", "server must be a boolean or nil, got " .. type(server))
  end
  check_nargs("check", 1, ...)
  local gone = no_longer_ours(self) or client_closed(self)
  if gone then return nil, gone end
  local expires = expires_of(self)
  if (not self._lease or self._lease:state() ~= "held") and expires and now() >= expires then
    -- Not renewed (or no longer: max_hold), and its TTL has run out by now.
    return nil, set_lost(self, "its TTL ran out")
  end
  if server then
    local ms, err = lock_eval(self, "check", "pttl")
    if not ms then return nil, err end
  end
  return true
end

lock_mt.__tostring = function(self)
  return string_format("redislock lock %s (fence %s, %s)", quote(self.key), tostring(self.fence), self._state)
end

-- Lua 5.4 `local l <close> = ...`: release at scope exit. When the scope is left
-- by an error, that error wins; otherwise a failed release raises, so a lost
-- lock is never passed over in silence; but not when the code closed the
-- lock's client first (cleanup in any order must not raise).
lock_mt.__close = function(self, err)
  if err ~= nil then
    pcall(self.release, self)
    return
  end
  local ok, rerr = self:release()
  if not ok and not self._client._transport:closed() then error(rerr, 0) end
end

------------------------------------------------------------------------------
-- with_lock

local function check_fn(n, fname, fn)
  local mt = getmetatable(fn)
  if type(fn) ~= "function" and not (type(mt) == "table" and mt.__call) then
    argerror(n, fname, "function expected, got " .. type(fn))
  end
end

-- The arguments of both with_locks, checked; returns the ttl in ms and how to wait.
local function check_with_lock_args(key, ttl, fn, opts, ...)
  check_key(1, "with_lock", key)
  local ms = check_seconds(2, "with_lock", "ttl", ttl)
  check_fn(3, "with_lock", fn)
  local how = check_acquire_opts(4, "with_lock", opts, true)
  check_nargs("with_lock", 4, ...)
  return ms, how
end

-- pack(pcall(fn, lock)). On Lua 5.4 the lock is also held by a to-be-closed
-- guard while fn runs, so that closing a coroutine suspended inside fn
-- (coroutine.close) releases it. A coroutine that is merely dropped keeps the
-- lock until its TTL: the garbage collector does no I/O.
local call_locked = function(lock, fn) return pack(pcall(fn, lock)) end
if load("local guard <close> = nil") then -- Lua 5.4 and later
  local guard_mt = {
    __close = function(guard)
      if guard.lock then pcall(guard.lock.release, guard.lock) end
    end,
  }
  -- Compiled by load() so that LuaJIT, which cannot parse <close>, loads this file.
  call_locked = assert(load([[
    local pack, pcall, setmetatable, guard_mt = ...
    return function(lock, fn)
      local guard <close> = setmetatable({ lock = lock }, guard_mt)
      local res = pack(pcall(fn, lock))
      guard.lock = nil -- left normally: with_lock releases and reports
      return res
    end
  ]], "=redislock.with_lock"))(pack, pcall, setmetatable, guard_mt)
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
-- code runs (the hook looks again 10,000 instructions later), and when it did
-- abort fn, the locks fn took that nothing refers to any more are released
-- (fn may have been stopped between acquire's return and the variable that
-- would have released it). A scope records those locks: { lock, hook, co,
-- parent (the scope it hides), taken = { { client, key, token, ref }, ... },
-- aborted }. Scopes stack per coroutine (LuaJIT's main one is MAIN).
local MAIN = {}
local OURS = { [HERE] = true, ["=redislock.with_lock"] = true } -- sources of redislock's Lua code
local scopes = setmetatable({}, { __mode = "k" })
local WEAK_VALUES = { __mode = "v" }

local function running()
  return coroutine_running() or MAIN
end

-- Notes a lock just taken in the current coroutine's scope, if any (called by
-- acquire; costs one `next` when no with_lock watches for on_lost).
note_taken = function(client, lock)
  local scope = next(scopes) ~= nil and scopes[running()]
  if not scope then return end
  scope.taken[#scope.taken + 1] = { client = client, key = lock.key, token = lock.token,
                                    ref = setmetatable({ lock }, WEAK_VALUES) }
end

-- Starts watching lock for on_lost while fn runs; returns the scope, or nil.
local function watch_lost(lock)
  if not (lock._on_lost and lock._lease) or ngx_transport or debug_gethook() then
    return nil
  end
  local co = running()
  local scope = { lock = lock, co = co, parent = scopes[co], taken = {} }
  scope.hook = function()
    if lock._state ~= "held" or lock._lease:state() ~= "lost" then return end
    if OURS[debug_getinfo(2, "S").source] then return end -- not inside redislock
    scope.aborted = true
    lease_lost(lock) -- calls on_lost, which may raise
  end
  scopes[co] = scope
  debug_sethook(scope.hook, "", 10000)
  return scope
end

-- Ends the scope; ok: fn returned normally. A hook fn set for itself stays.
local function unwatch(scope, ok)
  scopes[scope.co] = scope.parent
  if debug_gethook() == scope.hook then debug_sethook() end
  if ok or not scope.aborted or #scope.taken == 0 then return end
  -- Aborted: fn's frames are gone, so a lock nothing else refers to is
  -- collected now; release those (a lock released before is left alone by
  -- the compare-and-delete).
  collectgarbage("collect")
  for _, t in ipairs(scope.taken) do
    if t.ref[1] == nil then
      pcall(Lock.release, setmetatable({ key = t.key, token = t.token, _client = t.client, _state = "held" },
                                       lock_mt))
    end
  end
end

-- Runs fn(lock) under the lock and releases it in every case.
local function with_lock(self, key, ms, fn, how)
  local lock, err = acquire(self, key, ms, how, true)
  if not lock then error(err, 0) end
  local scope = watch_lost(lock)
  local res = call_locked(lock, fn)
  if scope then unwatch(scope, res[1]) end
  -- Protected: fn's own error must be the one that comes out, whatever
  -- release does.
  local rok, released, rerr = pcall(lock.release, lock)
  -- Stopped here too: a lease found lost elsewhere (the OpenResty renewal
  -- timer) could not end the sentinel, which only this thread may kill.
  if lock._lease then lock._lease:stop() end
  if not res[1] then error(res[2], 0) end
  if not rok then error(released, 0) end
  if not released then error(rerr, 0) end
  return unpack(res, 2, res.n)
end

--- Calls fn(lock) while holding the lock named key, then releases it.
-- Returns exactly what fn returned. Raises "busy: ..." or "connection: ..." when
-- the lock cannot be taken, fn's own error value (unchanged) when fn raises, and
-- "lost: ..." when the lock was no longer ours at release.
-- @param opts optional table: wait (seconds to keep trying to acquire)
function Client:with_lock(key, ttl, fn, opts, ...)
  check_client(self, "with_lock")
  local ms, how = check_with_lock_args(key, ttl, fn, opts, ...)
  return with_lock(self, key, ms, fn, how)
end

local default_client

--- The client used by redislock.with_lock: REDIS_URL, else 127.0.0.1:6379.
-- Made on first use, and again after it was closed.
function _M.default_client()
  if not default_client or default_client._transport:closed() then
    local url = os_getenv("REDIS_URL")
    if url and url ~= "" then
      local ok, c = pcall(_M.new, { url = url })
      if not ok then raise_at_caller("redislock: REDIS_URL is not usable: " .. tostring(c)) end
      default_client = c
    else
      default_client = _M.new()
    end
  end
  return default_client
end

--- redislock.with_lock(key, ttl, fn[, opts]) on the default client.
function _M.with_lock(key, ttl, fn, opts, ...)
  local ms, how = check_with_lock_args(key, ttl, fn, opts, ...)
  local client = _M.default_client()
  check_open(client, "with_lock")
  return with_lock(client, key, ms, fn, how)
end

return _M
