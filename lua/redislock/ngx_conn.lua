-- SPDX-License-Identifier: MIT
--- redislock.ngx_conn: the connections of the OpenResty transport
-- (redislock/ngx.lua): a pool per server and set of credentials and TLS
-- settings, the TLS handshake, what a new connection is sent first (AUTH,
-- SELECT, ROLE), and reading a reply with the C core's reader.

local args = require("redislock.args")
local core = require("redislock.core")
local semaphore = require("ngx.semaphore")
local tls_mod = require("redislock.tls")

local ngx = ngx
local io_open, ipairs, pairs, tostring, type = io.open, ipairs, pairs, tostring, type
local string_format, table_concat = string.format, table.concat
local tcp, md5 = ngx.socket.tcp, ngx.md5
local encode, new_reader, core_io_message, now = core.encode, core.reader, core.io_message, core.now

local _M = { _VERSION = core._VERSION }

-- The bytes one receiveany may return (a call's replies, a subscription's messages).
local READ_SIZE = 16384

-- Salts the password's digest in pool names (pools live in one worker).
local POOL_SALT = core.token()

-- Connections a worker opens to one pool at most when pool_size is not
-- given (nginx's default lua_socket_pool_size).
local POOL_SIZE = 30

-- Seconds a connection's user is given past its step's timeout before its
-- place is taken back (its request ended without giving the connection back).
local SLACK = 1

args.own(debug.getinfo(1, "S").source)

-- A file's contents, or raises a bad argument to 'new' naming field.
local function read_file(field, path)
  local f, err = io_open(path, "rb")
  local data = f and f:read("*a")
  if f then f:close() end
  if not data then
    args.argerror(1, "new", string_format("tls.%s: cannot read %s: %s", field, args.quote(path), err))
  end
  return data
end

-- Checks the TLS settings (redislock/tls.lua's) and their files, and what
-- nginx can do of them, and sets the fields open() uses: tls_verify,
-- tls_name, tls_cert, tls_key, and what the pool name must tell apart.
local function tls_setup(self, t, host)
  tls_mod.check_files(t)
  if t.ca then
    -- ngx_lua 0.10.23 verifies against nginx's store only; taking the
    -- option and not honouring it would be worse than refusing it.
    args.argerror(1, "new", "option 'tls.ca' cannot be honoured per connection under OpenResty: nginx"
      .. " verifies against the lua_ssl_trusted_certificate directive (set it to this file, and drop tls.ca)")
  end
  local name = t.server_name or host
  if t.verify and not t.server_name and (host:find("^[%d.]+$") or host:find(":", 1, true)) then
    -- nginx checks names with X509_check_host: DNS names only, never IP SANs.
    args.argerror(1, "new", "under OpenResty a TLS host given as an address needs 'tls.server_name' (a DNS"
      .. " name in the server's certificate): nginx checks DNS names only")
  end
  self.tls, self.tls_verify, self.tls_name = true, t.verify, name
  if t.cert then
    local ssl = require("ngx.ssl")
    local cert, cerr = ssl.parse_pem_cert(read_file("cert", t.cert))
    local key, kerr = ssl.parse_pem_priv_key(read_file("key", t.key))
    if not cert then args.argerror(1, "new", "tls.cert: " .. tostring(cerr)) end
    if not key then args.argerror(1, "new", "tls.key: " .. tostring(kerr)) end
    self.tls_cert, self.tls_key = cert, key
  end
  return table_concat({ "tls", name, t.verify and "verify" or "noverify", t.cert or "" }, ":")
end

--- Sets the fields of transport self (redislock/ngx.lua's, from the
-- checked fields c; host: its TCP host) that open() uses: its pool, TLS
-- settings, and the bytes a new connection is sent first. Reads TLS files.
function _M.configure(self, c, host)
  local db = self.db
  -- A pool of its own: a pooled connection carries its AUTH and SELECT, so it
  -- must never be handed to a client of another server, db or user (nor to
  -- lua-resty-redis, whose default pool is named "host:port").
  -- Nor a TLS connection to a client with other TLS settings, or none.
  local tls = c.tls and tls_setup(self, c.tls, host) or "plain"
  self.tls_name_fixed = c.tls and c.tls.server_name ~= nil
  self.pool_rest = table_concat({ db, c.username or "", c.password and md5(POOL_SALT .. c.password) or "", tls }, "/")
  self.pool_size, self.wait_connections = c.pool_size, c.wait_connections or 2
  _M.repool(self)
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
  if c.master_only then -- behind Sentinel: a new connection checks the node is still the master
    setup[#setup + 1] = encode("ROLE")
    names[#names + 1] = "ROLE"
  end
  if #setup > 0 then
    self.setup, self.setup_names = table_concat(setup), names
  end
end

--- Sets the pools of self for its address (again after retarget): one for
-- the calls, at most pool_size connections a worker (30 when nil), and one
-- for the waits that block (BLPOP), at most wait_connections: a wait that
-- finds them all in use fails at once (wait_s 0), and its waiter polls.
function _M.repool(self)
  local name = self.where .. "/" .. self.pool_rest
  self.pool_opts = { pool = "redislock/" .. name, pool_size = self.pool_size or POOL_SIZE,
                     wait_s = self.connect_timeout_ms / 1000 }
  self.wait_pool_opts = { pool = "redislock-wait/" .. name, pool_size = self.wait_connections, wait_s = 0 }
end

-- ----------------------------------------------------------------------------
-- How many connections a worker has open to each pool: never more than its
-- size. nginx's own bound (connect's backlog option) lets a few more
-- through under load (ngx_lua 0.10.23: with pool_size 4, 1,000 concurrent
-- requests had 9 connections open at once, and closed 296), so the bound is
-- kept here. A place is a ticket; a call that finds every place taken
-- queues (FIFO, on an ngx.semaphore) for at most its connect timeout, and a
-- place given back goes to the first in the queue, never to a newcomer. A
-- request that ends while it holds a place (ngx.exit from another thread)
-- cannot give it back: a place whose holder is overdue (ticket.due, set
-- before each step) is taken back by whoever waits for one.

-- pool name -> { size, used, queue (ngx.semaphore), tickets (ticket -> true) }
local places = {}

-- Frees a place of p: to the first call that waits for one, if any.
local function free(p)
  if p.queue:count() < 0 then
    p.queue:post(1)
  else
    p.used = p.used - 1
  end
end

-- Takes back the places whose holders are overdue, for the calls that wait.
local function reclaim(p)
  local t = now()
  for ticket in pairs(p.tickets) do
    if ticket.due < t then
      p.tickets[ticket] = nil
      free(p)
    end
  end
end

-- A place in pool opts (its pool, pool_size and wait_s) for a holder whose
-- first step may take due_s seconds: a ticket, or nil and why not.
local function take_place(opts, due_s)
  local p = places[opts.pool]
  if not p then
    p = { size = opts.pool_size, used = 0, queue = semaphore.new(0), tickets = {} }
    places[opts.pool] = p
  end
  if p.used >= p.size then reclaim(p) end
  if p.used < p.size then
    p.used = p.used + 1
  else
    local given = opts.wait_s > 0 and p.queue:wait(opts.wait_s) -- the place of one that left
    -- A place given as the wait ran out stays with the semaphore: take it.
    if not given and p.queue:count() > 0 then given = p.queue:wait(0) end
    if not given then
      reclaim(p)
      if p.used >= p.size then
        return nil, string_format("its %d connections of this nginx worker were all in use%s", p.size,
                                  opts.wait_s > 0 and string_format(" for %.3g s", opts.wait_s) or "")
      end
      p.used = p.used + 1
    end
  end
  local ticket = { pool = p, due = now() + due_s }
  p.tickets[ticket] = true
  return ticket
end

-- Gives ticket's place back: to the first call that waits for one, if any.
-- Nothing when it was taken back meanwhile.
local function give_place(ticket)
  local p = ticket.pool
  if not p.tickets[ticket] then return end
  p.tickets[ticket] = nil
  free(p)
end


--- A cosocket error as a "connection: ..." message, worded as the C
-- transport words its own (core.io_message).
local function io_message(self, err, read_ms)
  return core_io_message(self.where, tostring(err), read_ms or self.timeout_ms)
end

--- Reads until reader:reply() has a complete reply. Returns what it returned;
-- or nil, a message, and true when the connection failed or sent bytes that
-- cannot be read (then it must be closed, never pooled) and, fourth, true when
-- that failure was a timeout.
local function read_reply(self, sock, reader)
  while true do
    local a, b, unreadable = reader:reply()
    if unreadable then return nil, b, true end
    if a ~= nil or b ~= nil then return a, b end
    local data, err = sock:receiveany(READ_SIZE)
    if not data then return nil, io_message(self, err), true, err == "timeout" end
    reader:feed(data)
  end
end

-- What nginx's handshake errors mean, for the message.
local function tls_hint(err)
  if err:find("host mismatch", 1, true) then
    return "name mismatch: the server's certificate does not name the host; tls.server_name sets the name to check"
  elseif err:find("certificate verify failed", 1, true) or err:find("^%d+: ") then
    return "the server's certificate is not trusted: " .. err .. "; lua_ssl_trusted_certificate names the trust anchors"
  elseif err:find("wrong version number", 1, true) or err:find("record layer", 1, true) then
    return err .. "; the server does not speak TLS on this port"
  end
  return err
end

-- The TLS handshake on a new connection (client certificate, SNI, the name
-- checked when verifying). true, or nil and a "connection: ..." message.
local function handshake(self, sock)
  if self.tls_cert then
    local ok, err = sock:setclientcert(self.tls_cert, self.tls_key)
    if not ok then return nil, string_format("connection: cannot connect to %s (TLS: %s)", self.where, err) end
  end
  local ok, err = sock:sslhandshake(false, self.tls_name, self.tls_verify)
  if not ok then
    return nil, string_format("connection: cannot connect to %s (TLS: %s)", self.where,
                              tls_hint(err or "handshake failed"))
  end
  -- lua-resty-core 0.1.25 returns true for a handshake that finished at once
  -- but failed verification (nginx then closed the socket and logged why).
  if not sock:getreusedtimes() then
    return nil, string_format("connection: cannot connect to %s (TLS: the server's certificate failed"
      .. " verification, untrusted or not naming %s; nginx's error log says which)", self.where, self.tls_name)
  end
  return true
end

-- The error of a new connection to a node that is no longer the master
-- (master_only): READONLY, as the node would answer a write, but nothing was
-- sent (class "demoted": redislock/sentinel.lua resolves the master and
-- tries again at once). The role the node said is kept beside it, in the
-- transport's last_role.
local NOT_MASTER = "redis: READONLY %s says ROLE %s on a new connection, not master (nothing was sent)"

-- A connection, pooled or new, in pool opts; a new one has been
-- authenticated and has its db selected (and, master_only, said ROLE master;
-- self.last_role is the role it said, set before anything yields again).
-- Returns the socket and how often it was reused, or nil and a
-- "connection: ..." / "redis: ..." message.
local function connect(self, opts)
  local sock = tcp()
  sock:settimeouts(self.connect_timeout_ms, self.timeout_ms, self.timeout_ms)
  local ok, err
  if self.path then
    ok, err = sock:connect("unix:" .. self.path, opts)
  else
    ok, err = sock:connect(self.host, self.port, opts)
  end
  if not ok then
    return nil, string_format("connection: cannot connect to %s (%s)", self.where, err)
  end
  local reused = sock:getreusedtimes()
  if reused == 0 and self.tls then
    ok, err = handshake(self, sock)
    if not ok then
      sock:close()
      return nil, err
    end
  end
  if reused == 0 and self.setup then
    ok, err = sock:send(self.setup)
    if not ok then
      sock:close()
      return nil, io_message(self, err)
    end
    local reader = new_reader()
    for _, what in ipairs(self.setup_names) do
      local v, msg, failed = read_reply(self, sock, reader)
      if v == nil then
        sock:close()
        if not failed then -- the server refused: "redis: WRONGPASS ..."
          msg = string_format("redis: %s refused by %s: %s", what, self.where, msg:sub(8))
        end
        return nil, msg
      end
      if what == "ROLE" then
        self.last_role = type(v) == "table" and tostring(v[1]) or tostring(v)
        if self.last_role ~= "master" then
          sock:close()
          return nil, string_format(NOT_MASTER, self.where, self.last_role)
        end
      end
    end
  end
  return sock, reused
end

--- open(self[, pool_opts[, ticket]]) -> sock, reused, ticket | nil, err: a
-- connection (see connect above) in pool_opts (the transport's calls' pool
-- when nil; or its wait pool), and the ticket of its place there (a place
-- of its own: a new one unless ticket, the one a call already holds, is
-- given, and still its: not taken back). give_back gives both back. A
-- subscription's pool (one of its own, no pool_size) takes no place.
local function open(self, pool_opts, ticket)
  local opts = pool_opts or self.pool_opts
  if opts.pool_size and not (ticket and ticket.pool.tickets[ticket]) then
    local why
    ticket, why = take_place(opts, (self.connect_timeout_ms + 2 * self.timeout_ms) / 1000 + SLACK)
    if not ticket then return nil, string_format("connection: cannot connect to %s (%s)", self.where, why) end
  end
  local sock, reused = connect(self, opts)
  if not sock and ticket then give_place(ticket) end
  return sock, reused, ticket
end

--- Says that the call holding ticket (if any) takes a step of at most ms
-- milliseconds now: its place is not taken back before.
local function busy_for(ticket, ms)
  if ticket then ticket.due = now() + ms / 1000 + SLACK end
end

--- Puts a healthy connection back into the pool, whose size connect() set.
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

--- After a call: a failed connection is closed, a healthy one pooled; then
-- its place (ticket, if any) is given back.
local function give_back(self, sock, failed, ticket)
  if failed then
    sock:close()
  else
    keepalive(self, sock)
  end
  if ticket then give_place(ticket) end
end

_M.io_message, _M.read_reply, _M.open, _M.give_back, _M.busy_for = io_message, read_reply, open, give_back, busy_for
_M.READ_SIZE = READ_SIZE

return _M
