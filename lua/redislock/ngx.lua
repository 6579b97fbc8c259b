-- SPDX-License-Identifier: MIT
--- redislock.ngx: the OpenResty transport.
--
-- Under ngx_lua a blocking hiredis call would stall the nginx worker and every
-- request on it, so `redislock.new` picks this transport when `ngx` is present.
-- It sends the bytes the C core makes (`core.encode_script`, `core.encode`)
-- over `ngx.socket.tcp` cosockets and feeds what it reads into the core's
-- reply reader: the lock protocol itself stays in one place, the C core.
--
-- Each call takes a connection from the nginx connection pool (or opens one,
-- then sends AUTH and SELECT), runs its command, and puts the connection back
-- with `setkeepalive`. A client therefore holds no socket between calls and
-- may be shared by every request of a worker (cosockets cannot outlive the
-- request that made them). It has the methods of the C client that
-- redislock.lua uses (eval, wait, command, close, closed) and io_problem.

local core = require "redislock.core"

local ngx = ngx
local ipairs, pairs, pcall, setmetatable, tostring = ipairs, pairs, pcall, setmetatable, tostring
local co_running, co_status = coroutine.running, coroutine.status
local debug_getinfo = debug.getinfo
local string_format, table_concat = string.format, table.concat
local tcp, get_phase, md5 = ngx.socket.tcp, ngx.get_phase, ngx.md5
local timer_at, ngx_log, ERR = ngx.timer.at, ngx.log, ngx.ERR
local spawn, kill = ngx.thread.spawn, ngx.thread.kill
local math_max, math_min = math.max, math.min
local encode, encode_script, encode_wait, new_reader = core.encode, core.encode_script, core.encode_wait, core.reader

local _M = { _VERSION = core._VERSION }

local Transport = {}
local mt = { __index = Transport }

-- The bytes one receiveany may return; replies to lock scripts are ~20 bytes.
local READ_SIZE = 16384

-- Phases in which cosockets (and ngx.sleep) may be used.
local YIELDABLE = {
  server_rewrite = true, rewrite = true, access = true, content = true, timer = true,
  ssl_cert = true, ssl_session_fetch = true, ssl_client_hello = true, preread = true,
}

-- Salts the password's digest in pool names (pools live in one worker).
local POOL_SALT = core.token()

--- Makes a transport from the checked fields redislock.new gathered: host,
-- port, path, username, password, db, connect_timeout_ms, timeout_ms, prefix,
-- pool_size, keepalive_timeout_ms. No I/O.
function _M.new(c)
  local db = c.db or 0
  local host, port = c.host or "127.0.0.1", c.port or 6379
  -- As the C transport names it (rl_conn_describe), and as connect wants it.
  local addr = host:find(":", 1, true) and "[" .. host .. "]" or host
  local where = c.path and "unix:" .. c.path or string_format("%s:%d", addr, port)
  local self = {
    host = addr, port = port, path = c.path, where = where,
    prefix = c.prefix or "lock:",
    connect_timeout_ms = c.connect_timeout_ms or 1000, timeout_ms = c.timeout_ms or 1000,
    keepalive_ms = c.keepalive_timeout_ms, pool_size = c.pool_size, closed_ = false,
  }
  -- A pool of its own: a pooled connection carries its AUTH and SELECT, so it
  -- must never be handed to a client of another server, db or user (nor to
  -- lua-resty-redis, whose default pool is named "host:port").
  self.pool_opts = {
    pool = table_concat({ "redislock", where, db, c.username or "",
                          c.password and md5(POOL_SALT .. c.password) or "" }, "/"),
    pool_size = c.pool_size,
  }
  -- What a fresh connection is sent first, in one write.
  local setup, names = {}, {}
  if c.password then
    setup[#setup + 1] = c.username and encode("AUTH", c.username, c.password) or encode("AUTH", c.password)
    names[#names + 1] = "AUTH"
  end
  if db ~= 0 then
    setup[#setup + 1] = encode("SELECT", db)
    names[#names + 1] = "SELECT"
  end
  if #setup > 0 then
    self.setup, self.setup_names = table_concat(setup), names
  end
  return setmetatable(self, mt)
end

--- nil when cosockets can be used now, else the name of the nginx phase that
-- forbids them (init, init_worker, set, header_filter, body_filter, log ...).
function Transport.io_problem(_)
  local phase = get_phase()
  if YIELDABLE[phase] then return nil end
  return phase
end

-- A cosocket error as a "connection: ..." message.
local function io_message(self, err)
  if err == "timeout" then
    return string_format("connection: %s did not answer within %g s (timeout)", self.where, self.timeout_ms / 1000)
  elseif err == "closed" then
    return string_format("connection: %s closed the connection", self.where)
  end
  return string_format("connection: lost %s (%s)", self.where, err)
end

-- Reads until reader[method] has a complete reply. Returns what it returned;
-- or nil, a message, and true when the connection failed or sent bytes that
-- cannot be read (then it must be closed, never pooled) and, fourth, true when
-- that failure was a timeout.
local function read_reply(self, sock, reader, method)
  while true do
    local a, b, unreadable = reader[method](reader)
    if unreadable then return nil, b, true end
    if a ~= nil or b ~= nil then return a, b end
    local data, err = sock:receiveany(READ_SIZE)
    if not data then return nil, io_message(self, err), true, err == "timeout" end
    reader:feed(data)
  end
end

-- Sends bytes and reads one reply with reader[method] (see read_reply).
local function round_trip(self, sock, bytes, method)
  local ok, err = sock:send(bytes)
  if not ok then return nil, io_message(self, err), true, err == "timeout" end
  return read_reply(self, sock, new_reader(), method)
end

-- A connection, pooled or new; a new one has been authenticated and has its
-- db selected. Returns the socket and how often it was reused, or nil and a
-- "connection: ..." / "redis: ..." message.
local function open(self)
  local sock = tcp()
  sock:settimeouts(self.connect_timeout_ms, self.timeout_ms, self.timeout_ms)
  local ok, err
  if self.path then
    ok, err = sock:connect("unix:" .. self.path, self.pool_opts)
  else
    ok, err = sock:connect(self.host, self.port, self.pool_opts)
  end
  if not ok then
    return nil, string_format("connection: cannot connect to %s (%s)", self.where, err)
  end
  local reused = sock:getreusedtimes()
  if reused == 0 and self.setup then
    ok, err = sock:send(self.setup)
    if not ok then
      sock:close()
      return nil, io_message(self, err)
    end
    local reader = new_reader()
    for _, what in ipairs(self.setup_names) do
      local v, msg, failed = read_reply(self, sock, reader, "reply")
      if v == nil then
        sock:close()
        if not failed then -- the server refused: "redis: WRONGPASS ..."
          msg = string_format("redis: %s refused by %s: %s", what, self.where, msg:sub(8))
        end
        return nil, msg
      end
    end
  end
  return sock, reused
end

-- Puts a healthy connection back into the pool, whose size connect() set.
-- No explicit nil: older ngx_lua refuses it (nginx's default applies then).
local function keepalive(self, sock)
  local ok
  if self.keepalive_ms then
    ok = sock:setkeepalive(self.keepalive_ms)
  else
    ok = sock:setkeepalive()
  end
  if not ok then sock:close() end
end

-- After a round trip: a failed connection is closed, a healthy one pooled.
local function give_back(self, sock, failed)
  if failed then
    sock:close()
  else
    keepalive(self, sock)
  end
end

-- Sends bytes (from the core's encoders, which check the arguments) on a
-- connection of its own, reading the reply for at most read_ms. Returns the
-- reply, or nil and an error message.
local function one_reply(self, bytes, read_ms)
  local sock, err = open(self)
  if not sock then return nil, err end
  sock:settimeouts(self.connect_timeout_ms, self.timeout_ms, read_ms)
  local v, msg, failed = round_trip(self, sock, bytes, "reply")
  give_back(self, sock, failed)
  if v == nil then return nil, msg end
  return v
end

--- transport:eval(op, key, token[, ms[, replicas, replica_ms]]) -> status, value[, acked | nil, err] | nil, err
-- Runs one lock script, as the C client's eval does: EVALSHA, then EVAL after
-- NOSCRIPT, and WAIT on the same connection after a success when replicas
-- is given. A command lost on a pooled connection that the server had closed
-- is sent once more on another connection (maybe another pooled one; the C
-- transport opens a fresh one), except release (see rl_conn.c).
function Transport:eval(op, key, token, ms, replicas, replica_ms)
  local bytes = encode_script(op, key, token, ms, self.prefix)  -- checks the arguments
  local err
  for _ = 1, 2 do
    local sock, reused = open(self)
    if not sock then return nil, reused end
    local status, value, failed, timed_out = round_trip(self, sock, bytes, "script_reply")
    if status == false then -- NOSCRIPT: EVAL also caches the script
      status, value, failed, timed_out = round_trip(self, sock, encode_script(op, key, token, ms, self.prefix, true),
                                                    "script_reply")
      if status == false then status, value = nil, "redis: NOSCRIPT after EVAL" end
    end
    if not failed and status == 1 and replicas then
      -- WAIT counts the writes of this very connection. Its reply may take
      -- replica_ms.
      sock:settimeouts(self.connect_timeout_ms, self.timeout_ms, self.timeout_ms + replica_ms)
      local acked, werr, wfailed = round_trip(self, sock, encode("WAIT", replicas, replica_ms), "reply")
      give_back(self, sock, wfailed)
      if acked == nil then return status, value, nil, werr end -- ours, but unconfirmed
      return status, value, acked
    end
    give_back(self, sock, failed)
    if not failed then return status, value end
    err = value
    if reused == 0 or timed_out or op == "release" then break end
  end
  return nil, err
end

--- transport:wait(key, token, ms) -> true | false | nil, err (as the C client's
-- wait): blocks on the lock's wake-up list for at most ms, on a connection of
-- its own from the pool; true when woken, false when the time ran out.
function Transport:wait(key, token, ms)
  -- The server may take the whole wait before it answers.
  local v, err = one_reply(self, encode_wait(key, token, ms, self.prefix), ms + self.timeout_ms)
  if v == nil then return nil, err end
  return v ~= false
end

--- transport:command(name, ...) -> reply | nil, err (as the C client's command).
-- Never resent: INCR twice is wrong.
function Transport:command(...)
  local v, err = one_reply(self, encode(...), self.timeout_ms)
  if v == nil then return nil, err end
  return v
end

------------------------------------------------------------------------------
-- Renewal: one ngx.timer per worker renews the worker's leases over cosockets
-- (the C watchdog thread is for plain Lua; nginx workers are single-threaded).
--
-- A lock with_lock took must not outlive the request's Lua thread that runs
-- fn. ngx.exit, ngx.exec and ngx.redirect end that thread without unwinding
-- (no pcall, no <close> runs), and ngx.thread.kill can end it too; the timer,
-- which belongs to the worker, would renew such a lock for ever. So with_lock's
-- lease comes with a sentinel: a light thread of fn's thread that waits on a
-- semaphore of its own. nginx ends every light thread of a request that is
-- left by ngx.exit/exec/redirect, which takes the sentinel off the semaphore;
-- the sentinel leaves by itself once fn's thread is dead (killed). Either way
-- the semaphore has no waiter any more, and the timer, at the lease's next
-- renewal, releases the lock instead of renewing it. with_lock kills the
-- sentinel when it ends normally.

local semaphore -- ngx.semaphore (lua-resty-core), loaded on first use

-- How often the sentinel looks whether fn's thread was killed (seconds).
local SENTINEL_STEP = 1

-- Whether the running coroutine is one that nginx ends with the request: a
-- handler's entry thread or a light thread. A light thread spawned from a
-- coroutine the code made itself (coroutine.create) would, if that coroutine
-- were dropped while suspended, keep the request open for ever: nginx waits
-- for it. Timers are left out (their entry thread cannot be told apart).
local function request_thread()
  if get_phase() == "timer" then return false end
  local _, why = kill(co_running())
  if why == "killer not parent" then return true end -- a light thread
  -- A handler's entry thread has the handler's chunk at the bottom of its stack.
  local level, what = 2, nil
  while true do
    local info = debug_getinfo(level, "S")
    if not info then break end
    what, level = info.what, level + 1
  end
  return what == "main"
end

-- The sentinel's body: waits until fn's thread (owner) is dead, or nginx ends
-- it with the request.
local function sentinel(sema, owner)
  repeat sema:wait(SENTINEL_STEP) until co_status(owner) == "dead"
end

-- Whether the request thread behind a lease's sentinel is gone.
local function abandoned(lease)
  return lease.sema ~= nil and lease.sema:count() >= 0
end

-- Leases being renewed, weakly: a lease whose lock was garbage-collected
-- drops out, and is no longer renewed.
local leases = setmetatable({}, { __mode = "k" })
local timer_due -- when the pending timer fires (core.now seconds), or nil
local ticking = false -- a tick is running: it schedules the next one itself

local Lease = {}
local lease_mt = { __index = Lease }

local schedule

-- Renews one lease (in the timer, so cosockets are allowed).
local function renew(lease, now)
  local t = lease.transport
  local ttl = lease.ttl_ms
  local status, value = t:eval("extend", lease.key, lease.token, ttl)
  if leases[lease] == nil then return end -- stopped meanwhile
  if lease.ttl_ms ~= ttl then return end  -- extended by its owner meanwhile
  if status == 1 then
    lease.confirmed, lease.due = now, now + math_max(ttl / 3000, 0.001)
    return
  end
  local why
  if status ~= nil then
    why = status == -1 and "another owner holds it now; found by the renewal timer"
      or "it expired or was deleted; found by the renewal timer"
  elseif core.now() >= lease.confirmed + ttl / 1000 then
    why = "the renewal timer could not renew it before its TTL ran out: " .. value
  else
    lease.due = core.now() + math_min(math_max(ttl / 10000, 0.01), 1)
    return
  end
  lease.status, lease.why = "lost", why
  leases[lease] = nil
  if lease.on_lost then
    local ok, err = pcall(lease.on_lost, why)
    if not ok then ngx_log(ERR, "redislock: on_lost raised: ", tostring(err)) end
  end
end

-- The timer: renews what is due, then schedules the next run.
local function tick(premature)
  timer_due = nil
  if premature then
    -- The worker is exiting (reload, stop): no timer runs any more, so the
    -- leases end here and run out by their TTL (check() says so then).
    for lease in pairs(leases) do
      lease.status = "ended"
      leases[lease] = nil
    end
    return
  end
  ticking = true
  local now = core.now()
  local due = {}
  local gone = {}
  for lease in pairs(leases) do
    if lease.stop_at and now >= lease.stop_at then
      lease.status = "ended"
      leases[lease] = nil
    elseif lease.due <= now then
      due[#due + 1] = lease
    end
  end
  for _, lease in ipairs(due) do
    if abandoned(lease) then gone[#gone + 1] = lease else renew(lease, now) end
  end
  for _, lease in ipairs(gone) do
    -- Its request's thread ended without unwinding: give the lock back.
    leases[lease] = nil
    lease.status = "ended"
    local status, err = lease.transport:eval("release", lease.key, lease.token)
    if status == nil then
      ngx_log(ERR, "redislock: cannot release a lock whose request ended inside with_lock (it runs out by its TTL): ",
              err)
    end
  end
  ticking = false
  schedule()
end

-- Makes sure a timer fires by the earliest due renewal.
schedule = function()
  if ticking then return end -- the running tick schedules when it is done
  local first
  for lease in pairs(leases) do
    if not first or lease.due < first then first = lease.due end
  end
  if not first or (timer_due and timer_due <= first) then return end
  local delay = math_max(first - core.now(), 0.001)
  local ok, err = timer_at(delay, tick)
  if ok then
    timer_due = first
  else
    ngx_log(ERR, "redislock: cannot start the renewal timer: ", err)
  end
end

--- transport:lease(key, token, ttl_ms[, max_hold_ms[, sent_ms[, scoped]]]) -> lease,
-- as the C client's (state, extended, expires, stop), renewed by this worker's
-- timer. sent_ms: when the acquire was sent (core.now() * 1000). scoped: the
-- lock must not outlive the running request thread (with_lock): it gets a
-- sentinel (see above) when that thread is one nginx ends with the request.
function Transport:lease(key, token, ttl_ms, max_hold_ms, sent_ms, scoped)
  local now = core.now()
  local sent = sent_ms and sent_ms / 1000 or now
  local lease = setmetatable({
    transport = self, key = key, token = token, ttl_ms = ttl_ms, confirmed = sent,
    due = sent + math_max(ttl_ms / 3000, 0.001),
    stop_at = max_hold_ms and max_hold_ms > 0 and now + max_hold_ms / 1000 or nil,
    status = "held",
  }, lease_mt)
  if scoped and request_thread() then
    semaphore = semaphore or require "ngx.semaphore"
    lease.sema = semaphore.new(0)
    lease.sentinel = spawn(sentinel, lease.sema, co_running()) -- waits at once: spawn returns then
  end
  leases[lease] = true
  schedule()
  return lease
end

--- "held" | "ended" | "lost", why
function Lease:state()
  return self.status, self.why
end

--- The owner extended the lock to ttl_ms with a command sent at sent_ms:
-- renew to that from then on.
function Lease:extended(ttl_ms, sent_ms)
  if self.status ~= "held" then return end
  local sent = sent_ms and sent_ms / 1000 or core.now()
  self.ttl_ms, self.confirmed, self.due = ttl_ms, sent, sent + math_max(ttl_ms / 3000, 0.001)
  schedule()
end

--- The latest time (core.now()) the lock lasts to without another renewal.
function Lease:expires()
  return self.confirmed + self.ttl_ms / 1000
end

--- No more renewals; ends the sentinel, if any, when called from the thread
-- that made it (with_lock's).
function Lease:stop()
  if self.status == "held" then self.status = "ended" end
  leases[self] = nil
  if self.sentinel and kill(self.sentinel) then self.sentinel = nil end
end

--- Marks the client closed; pooled connections stay in nginx's pool.
function Transport:close()
  self.closed_ = true
end

--- true once the client was closed.
function Transport:closed()
  return self.closed_
end

mt.__tostring = function(self)
  if self.closed_ then return "redislock.Client (closed)" end
  return string_format("redislock.Client (%s, cosockets)", self.where)
end

return _M
