-- SPDX-License-Identifier: MIT
--- redislock.ngx: the OpenResty transport.
--
-- Under ngx_lua a blocking socket call would stall the nginx worker and every
-- request on it, so `redislock.new` picks this transport when `ngx` is present.
-- Each call is the C core's call state machine (rl_call.h, through
-- `core.script_call` and `core.command_call`), which the C transport drives
-- too: it makes the bytes, decodes the replies, and takes the steps around
-- a call (the take's fall-back, NOSCRIPT, the one resend, ASKING, naming
-- the connection after its master, WAIT). This transport only moves the
-- bytes over `ngx.socket.tcp` cosockets and picks the connections.
--
-- Each call takes a connection from the nginx connection pool (or opens one,
-- then sends AUTH and SELECT), runs its command, and puts the connection back
-- with `setkeepalive`. A client therefore holds no socket between calls and
-- may be shared by every request of a worker (cosockets cannot outlive the
-- request that made them). It has the methods of the C client that the rest
-- of redislock uses (eval, wait, command, lease, close, closed; see
-- redislock/client.lua) and io_problem; its leases are redislock/ngx_lease.lua's,
-- its connections (pools, TLS, set-up, one round trip) redislock/ngx_conn.lua's.

local args = require("redislock.args")
local core = require("redislock.core")
local conn = require("redislock.ngx_conn")
local ngx_gate = require("redislock.ngx_gate")
local ngx_lease = require("redislock.ngx_lease")
local ngx_watch = require("redislock.ngx_watch")

local ngx = ngx
local ipairs, setmetatable, tostring, type = ipairs, setmetatable, tostring, type
local string_format = string.format
local get_phase = ngx.get_phase
local encode, encode_wait, new_reader = core.encode, core.encode_wait, core.reader
local script_call, command_call, args_call = core.script_call, core.command_call, core.args_call
local open, read_reply, io_message, give_back = conn.open, conn.read_reply, conn.io_message, conn.give_back
local busy_for = conn.busy_for
local READ_SIZE = conn.READ_SIZE

local _M = { _VERSION = core._VERSION }

local Transport = {}
local mt = { __index = Transport }

-- Phases in which cosockets (and ngx.sleep) may be used.
local YIELDABLE = {
  server_rewrite = true, rewrite = true, access = true, content = true, timer = true,
  ssl_cert = true, ssl_session_fetch = true, ssl_client_hello = true, preread = true,
}

args.own(debug.getinfo(1, "S").source)

--- Makes a transport from the checked fields redislock.new gathered: host,
-- port, path, username, password, db, connect_timeout_ms, timeout_ms, prefix,
-- tls, pool_size, wait_connections, keepalive_timeout_ms, and master_only (Sentinel's: each
-- new connection asks ROLE along with AUTH and SELECT, and is refused
-- unless the node says master, see open). No I/O but reading TLS files.
function _M.new(c)
  local host, port = c.host or "127.0.0.1", c.port or 6379
  -- As the C transport names it (rl_conn_describe), and as connect wants it.
  local addr = host:find(":", 1, true) and "[" .. host .. "]" or host
  local where = c.path and "unix:" .. c.path or string_format("%s:%d", addr, port)
  local self = {
    host = addr, port = port, path = c.path, where = where, db = c.db or 0,
    prefix = c.prefix or "lock:",
    connect_timeout_ms = c.connect_timeout_ms or 1000, timeout_ms = c.timeout_ms or 1000,
    keepalive_ms = c.keepalive_timeout_ms, closed_ = false,
  }
  conn.configure(self, c, host)
  return setmetatable(self, mt)
end

--- nil when cosockets can be used now, else the name of the nginx phase that
-- forbids them (init, init_worker, set, header_filter, body_filter, log ...).
function Transport.io_problem(_)
  local phase = get_phase()
  if YIELDABLE[phase] then return nil end
  return phase
end

-- Whether the call starting now goes after ASKING (transport:asking()).
local function asking_now(self)
  local asking = self.asking_next
  self.asking_next = nil
  return asking
end

-- Drives call (core.script_call's or core.command_call's: the C core's
-- state machine for one call, rl_call.h) over cosockets: a connection from
-- the pool (or a new one), its bytes sent, what comes read and fed to it;
-- another connection when it asks (maybe another pooled one). The
-- connection goes back to the pool when the call says it is in step.
-- pool_opts: the wait pool, or nil for the calls' pool. Returns call:result().
local function drive(self, call, pool_opts)
  if asking_now(self) then call:asking() end
  local sock, reused, ticket = open(self, pool_opts)
  if not sock then return nil, reused end
  local step, bytes = call:start(reused)
  while true do
    if step == "send" then
      busy_for(ticket, self.timeout_ms + call:read_ms())
      sock:settimeouts(self.connect_timeout_ms, self.timeout_ms, call:read_ms())
      local ok, err = sock:send(bytes)
      if ok then
        step = "read"
      else
        step = call:lost(err == "timeout", io_message(self, err))
      end
    elseif step == "read" then
      busy_for(ticket, call:read_ms())
      local data, err = sock:receiveany(READ_SIZE)
      if data then
        step, bytes = call:feed(data)
      else
        step = call:lost(err == "timeout", io_message(self, err, call:read_ms()))
      end
    elseif step == "reconnect" then
      sock:close()
      busy_for(ticket, self.connect_timeout_ms + 2 * self.timeout_ms)
      sock, reused, ticket = open(self, pool_opts, ticket)
      if not sock then -- open gave its place back
        call:close()
        return nil, reused
      end
      step, bytes = call:start(reused)
    else -- "done", "failed"
      give_back(self, sock, not call:keep(), ticket)
      return call:result()
    end
  end
end

--- transport:eval(op, key, token[, ms[, more]]) -> status, value[, acked | nil, err] | nil, err[, left]
-- Runs one lock script, as the C client's eval does (the C core's call:
-- a take and its fall-back, NOSCRIPT, the one resend, ASKING, WAIT
-- more.replicas more.replica_ms on the same connection after a success).
-- more.n: sem_acquire's limit, or the TTL a handoff gives (acquire_wait,
-- acquire_fair).
function Transport:eval(op, key, token, ms, more)
  local call = script_call(self, op, key, token, ms, more and more.n) -- checks the arguments
  if more and more.replicas then call:replicas(more.replicas, more.replica_ms) end
  return drive(self, call)
end

--- transport:script(op, keys, ...) -> reply | nil, err: one script sent
-- with its caller's arguments, as the C client's script does (the C
-- core's call: EVAL after NOSCRIPT, ASKING).
function Transport:script(...)
  return drive(self, args_call(self, ...)) -- checks the arguments
end

--- transport:wait(key, token, ms[, op]) -> wake-up | false | nil, err (as the C
-- client's wait): blocks on the wake-up list (the lock's, or that of the
-- primitive op belongs to) for at most ms, on a connection of its own from
-- the pool; what woke it (a string: a handoff carries the fence), or false
-- when the time ran out. Its connection comes from
-- the wait pool: nil and an error at once when the worker already blocks on
-- wait_connections of them (its waiter then polls).
function Transport:wait(key, token, ms, op)
  local call = command_call(self, encode_wait(key, token, ms, self.prefix, op))
  call:timeout(ms + self.timeout_ms) -- the server may take the whole wait before it answers
  local v, err = drive(self, call, self.wait_pool_opts)
  if v == nil then return nil, err end
  if v == false then return false end
  return type(v) == "table" and v[2] or true
end

--- transport:command(name, ...) -> reply | nil, err (as the C client's command).
-- Never resent: INCR twice is wrong.
function Transport:command(...)
  return drive(self, command_call(self, encode(...)))
end

--- transport:asking() -> true: the next eval, command or wait goes after
-- an ASKING on the same connection (Redis Cluster's ASK redirect; also the
-- EVAL after a NOSCRIPT). Read when the call starts, before it yields.
function Transport:asking()
  self.asking_next = true
  return true
end

--- transport:usable() -> true: each call takes a connection from the pool,
-- and a new one checks ROLE itself (master_only): nothing to ask first.
function Transport.usable()
  return true
end

--- transport:retarget(host, port): points the transport at another TCP host
-- and port (the master Sentinel named), with a pool of its own; leases follow,
-- as their timer renews through this transport.
function Transport:retarget(host, port)
  local addr = host:find(":", 1, true) and "[" .. host .. "]" or host
  self.host, self.port, self.path = addr, port, nil
  self.where = string_format("%s:%d", addr, port)
  if self.tls and not self.tls_name_fixed then self.tls_name = host end -- SNI for the new host
  conn.repool(self)
  ngx_lease.moved(self) -- its leases renew on the new node at once
  return true
end

-- A subscription's socket: never pooled (a pool of its own per call, and
-- closed at the end), so that no other user gets a subscribed connection.
local SUB_POOL = "redislock-subscription/" .. core.token()

--- transport:listen(channel, heard, stop) -> true | nil, err: subscribes to
-- channel on a connection of its own and calls heard(message) for each
-- message published there; with nothing heard for a second a PING checks
-- the server. Returns true once stop() says so (looked at every second),
-- or nil and why the connection failed. For a timer (redislock/ngx_watch.lua).
function Transport:listen(channel, heard, stop)
  local sock, err = open(self, { pool = SUB_POOL .. "/" .. core.token() })
  if not sock then return nil, err end
  sock:settimeouts(self.connect_timeout_ms, self.timeout_ms, 1000)
  local ok
  ok, err = sock:send(encode("SUBSCRIBE", channel))
  if not ok then
    sock:close()
    return nil, io_message(self, err)
  end
  local reader, idle = new_reader(), 0
  while true do
    local v, msg, _, timed_out = read_reply(self, sock, reader)
    if timed_out then
      if stop() then
        sock:close()
        return true
      end
      -- Nothing for a second: a PING, answered within the next, or the
      -- server is gone without a word.
      idle = idle + 1
      if idle > 1 or not sock:send(encode("PING")) then
        sock:close()
        return nil, string_format("connection: %s stopped answering", self.where)
      end
    elseif v == nil then
      sock:close()
      return nil, msg
    else
      idle = 0
      if type(v) == "table" and v[1] == "message" and v[2] == channel then heard(v[3]) end
      if stop() then
        sock:close()
        return true
      end
    end
  end
end

--- transport:lease(key, token, ttl_ms[, opts]) -> a node lease
-- (redislock/lease.lua), renewed by this worker's timer
-- (redislock/ngx_lease.lua).
function Transport:lease(...)
  return ngx_lease.start(self, ...)
end

--- Marks the client closed; pooled connections stay in nginx's pool.
function Transport:close()
  self.closed_ = true
end

--- true once the client was closed.
function Transport:closed()
  return self.closed_
end

--- What the topologies ask of the runtime under OpenResty (see
-- redislock/transport.lua's each, watch, check_names), and the waiting
-- strategy (waiting: the worker's gates).
_M.runtime = {
  -- A light thread per node; each node's timeout is set before its thread
  -- first yields (open reads it).
  each = function(nodes, timeout_ms, op, key, tok, ms)
    local spawn, wait = ngx.thread.spawn, ngx.thread.wait
    local threads, statuses, values = {}, {}, {}
    for i, t in ipairs(nodes) do
      t.timeout_ms = timeout_ms
      threads[i] = spawn(t.eval, t, op, key, tok, ms)
    end
    for i, th in ipairs(threads) do
      local ok, status, value = wait(th)
      if ok and status ~= nil then
        statuses[i], values[i] = status, value
      else
        statuses[i], values[i] = false, ok and value or tostring(status)
      end
    end
    return statuses, values
  end,
  watch = function(master, sentinels, client)
    local w, err = ngx_watch.get(master, sentinels, client)
    if not w then return nil, "connection: " .. err end
    return w
  end,
  waiting = ngx_gate.new,
  check_names = function(t, message, host)
    if t and t.verify and not t.server_name and (not host or host:find("^[%d.]+$") or host:find(":", 1, true)) then
      args.argerror(1, "new", message)
    end
  end,
}

mt.__tostring = function(self)
  if self.closed_ then return "redislock.Client (closed)" end
  return string_format("redislock.Client (%s, %scosockets)", self.where, self.tls and "TLS, " or "")
end

return _M
