-- SPDX-License-Identifier: MIT
--- redislock.ngx: the OpenResty transport.
--
-- Under ngx_lua a blocking socket call would stall the nginx worker and every
-- request on it, so `redislock.new` picks this transport when `ngx` is present.
-- It sends the bytes the C core makes (`core.encode_script`, `core.encode`)
-- over `ngx.socket.tcp` cosockets and feeds what it reads into the core's
-- reply reader: the scripts, commands and replies stay in one place, the C
-- core. The steps around a call (the take's fall-back, NOSCRIPT, the one
-- resend, ASKING, naming the connection after its master, WAIT) are, for
-- now, written here and in rl_conn.c alike.
--
-- Each call takes a connection from the nginx connection pool (or opens one,
-- then sends AUTH and SELECT), runs its command, and puts the connection back
-- with `setkeepalive`. A client therefore holds no socket between calls and
-- may be shared by every request of a worker (cosockets cannot outlive the
-- request that made them). It has the methods of the C client that the rest
-- of redislock uses (eval, wait, command, lease, close, closed; see
-- redislock/client.lua) and io_problem; its leases are redislock/ngx_lease.lua's,
-- its connections (pools, TLS, set-up, one round trip) redislock/ngx_conn.lua's.

local args = require "redislock.args"
local core = require "redislock.core"
local conn = require "redislock.ngx_conn"
local ngx_lease = require "redislock.ngx_lease"
local ngx_watch = require "redislock.ngx_watch"

local ngx = ngx
local ipairs, setmetatable, tostring, type = ipairs, setmetatable, tostring, type
local string_format = string.format
local get_phase = ngx.get_phase
local encode, encode_script, encode_wait, new_reader = core.encode, core.encode_script, core.encode_wait, core.reader
local setname = core.setname
local open, round_trip, read_reply, io_message, keepalive, give_back = conn.open, conn.round_trip, conn.read_reply,
      conn.io_message, conn.keepalive, conn.give_back

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
-- tls, pool_size, keepalive_timeout_ms, and master_only (Sentinel's: each
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
    keepalive_ms = c.keepalive_timeout_ms, pool_size = c.pool_size, closed_ = false,
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

-- The ops never sent twice: a second release would find the hold gone (the
-- C core's list, which its own transport follows).
local ONCE_ONLY = core.once_only

-- Whether the call starting now goes after ASKING (transport:asking()).
local function asking_now(self)
  local asking = self.asking_next
  self.asking_next = nil
  return asking
end

-- Sends bytes (from the core's encoders, which check the arguments) on a
-- connection of its own, reading the reply for at most read_ms. Returns the
-- reply, or nil and an error message.
local function one_reply(self, bytes, read_ms)
  local asking = asking_now(self)
  local sock, err = open(self)
  if not sock then return nil, err end
  sock:settimeouts(self.connect_timeout_ms, self.timeout_ms, read_ms)
  local v, msg, failed = round_trip(self, sock, bytes, "reply", asking)
  give_back(self, sock, failed)
  if v == nil then return nil, msg end
  return v
end

-- After a write that took the lock on sock: WAIT replicas replica_ms when
-- asked (WAIT counts the writes of this very connection; its reply may take
-- replica_ms), then the socket goes back. Returns eval's values.
local function confirmed(self, sock, status, value, replicas, replica_ms)
  if not replicas then
    keepalive(self, sock)
    return status, value
  end
  sock:settimeouts(self.connect_timeout_ms, self.timeout_ms, self.timeout_ms + replica_ms)
  local acked, werr, wfailed = round_trip(self, sock, encode("WAIT", replicas, replica_ms), "reply")
  give_back(self, sock, wfailed)
  if acked == nil then return status, value, nil, werr end -- ours, but unconfirmed
  return status, value, acked
end

local UNNAME = encode("CLIENT", "SETNAME", "")

-- After a take that took the lock on sock but whose fence's era is for the
-- acquire script to check (status 2; era: the master ID the era record
-- names, or ""): that script, on the same connection, after CLIENT SETNAME
-- naming the connection after that master; the script says whether that
-- is this master's ID, and when it does not say so the name goes (as in
-- rl_conn.c: rl_script.c, "Fences across failovers"). Returns eval's values.
local function check_era(self, sock, key, token, ms, era, replicas, replica_ms)
  local claim = era ~= "" and era or nil
  local status, value, failed = round_trip(self, sock, encode_script("acquire", key, token, ms, self.prefix,
                                                                     false, nil, claim),
                                           "script_reply", false, claim and setname(claim))
  if status == false then -- NOSCRIPT: EVAL also caches the script
    status, value, failed = round_trip(self, sock, encode_script("acquire", key, token, ms, self.prefix, true, nil,
                                                                 claim), "script_reply")
    if status == false then status, value = nil, "redis: NOSCRIPT after EVAL" end
  end
  if claim and not failed and status ~= 1 then
    -- Not confirmed: the name goes; if it cannot, the connection does
    -- (a name left in place could pass a stale era record).
    if not round_trip(self, sock, UNNAME, "reply") then failed = true end
    if status == 2 then status = 1 end
  end
  if not failed and status == 1 then return confirmed(self, sock, status, value, replicas, replica_ms) end
  give_back(self, sock, failed)
  if status == 1 and replicas then return status, value, nil, "connection: closed before WAIT " .. self.where end
  return status, value
end

-- A take (see rl_script.c): eval's values when it took the lock or failed;
-- "again" when the acquire script must follow: the lock is held (the script
-- tells its TTL and marks a waiter), or the answer was lost on a pooled
-- connection (the take may have landed, and only the script reconciles;
-- never a take twice).
local function take(self, key, token, ms, replicas, replica_ms)
  local bytes = encode_script("take", key, token, ms, self.prefix, false, nil, nil, true)  -- checks the arguments
  local sock, reused = open(self)
  if not sock then return nil, reused end
  local status, value, failed, timed_out = round_trip(self, sock, bytes, "take_reply")
  if status == 1 then return confirmed(self, sock, status, value, replicas, replica_ms) end
  if status == 2 then return check_era(self, sock, key, token, ms, value, replicas, replica_ms) end
  give_back(self, sock, failed)
  if status == -1 or (failed and reused ~= 0 and not timed_out) then return "again" end
  return nil, value
end

--- transport:eval(op, key, token[, ms[, replicas, replica_ms[, n]]]) -> status, value[, acked | nil, err] | nil, err
-- Runs one lock script, as the C client's eval does: EVALSHA, then EVAL after
-- NOSCRIPT, and WAIT on the same connection after a success when replicas
-- is given; a take, then the acquire script when the lock is held. A command
-- lost on a pooled connection that the server had closed is sent once more
-- on another connection (maybe another pooled one; the C transport opens a
-- fresh one), except the releases (see rl_conn.c). n: sem_acquire's limit.
function Transport:eval(op, key, token, ms, replicas, replica_ms, n)
  local asking = asking_now(self)
  if op == "take" and asking then op = "acquire" end -- a transaction after ASKING is refused whole
  if op == "take" then
    local status, value, acked, werr = take(self, key, token, ms, replicas, replica_ms)
    if status ~= "again" then return status, value, acked, werr end
    op = "acquire"
  end
  local bytes = encode_script(op, key, token, ms, self.prefix, false, n)  -- checks the arguments
  local err
  for _ = 1, 2 do
    local sock, reused = open(self)
    if not sock then return nil, reused end
    local status, value, failed, timed_out = round_trip(self, sock, bytes, "script_reply", asking)
    if status == false then -- NOSCRIPT: EVAL also caches the script (after ASKING again, if asked)
      status, value, failed, timed_out = round_trip(self, sock, encode_script(op, key, token, ms, self.prefix, true, n),
                                                    "script_reply", asking)
      if status == false then status, value = nil, "redis: NOSCRIPT after EVAL" end
    end
    if not failed and status == 1 then return confirmed(self, sock, status, value, replicas, replica_ms) end
    give_back(self, sock, failed)
    if not failed then return status, value end
    err = value
    if reused == 0 or timed_out or ONCE_ONLY[op] then break end
  end
  return nil, err
end

--- transport:wait(key, token, ms[, op]) -> true | false | nil, err (as the C client's
-- wait): blocks on the wake-up list (the lock's, or that of the primitive
-- op belongs to) for at most ms, on a connection of its own from the pool;
-- true when woken, false when the time ran out.
function Transport:wait(key, token, ms, op)
  -- The server may take the whole wait before it answers.
  local v, err = one_reply(self, encode_wait(key, token, ms, self.prefix, op), ms + self.timeout_ms)
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

--- transport:asking() -> true: the next eval, command or wait goes after
-- an ASKING on the same connection (Redis Cluster's ASK redirect; also the
-- EVAL after a NOSCRIPT). Read when the call starts, before it yields.
function Transport:asking()
  self.asking_next = true
  return true
end

-- This transport calls a lease's notify as its timer finds the lock lost.
Transport.reports_loss = true

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
    local v, msg, _, timed_out = read_reply(self, sock, reader, "reply")
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

--- transport:lease(key, token, ttl_ms[, max_hold_ms[, sent_ms[, scoped[, notify[, op]]]]]) -> lease:
-- renewed by this worker's timer (redislock/ngx_lease.lua).
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
-- redislock/transport.lua's each, lease, watch, moved, check_names).
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
  -- The worker's timer renews through the topology itself.
  lease = function(t, _, ...) return ngx_lease.start(t, ...) end,
  watch = function(master, sentinels, client)
    local w, err = ngx_watch.get(master, sentinels, client)
    if not w then return nil, "connection: " .. err end
    return w
  end,
  moved = function() end,
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
