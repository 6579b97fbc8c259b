-- SPDX-License-Identifier: MIT
--- redislock.sentinel: a master behind Redis Sentinel, as a transport (the
-- interface in redislock/transport.lua) over the node transport of the
-- master the sentinels name. Written once for both transports.
--
-- Resolving follows Redis' documented client protocol: the sentinels are
-- asked in order (SENTINEL get-master-addr-by-name), the first that answers
-- moves to the front, and the node it names must say ROLE master, else the
-- sentinels are asked again after a short pause. The master is resolved on
-- first use, after a connection error or a reply that says the node is no
-- longer the master (READONLY, MASTERDOWN, UNBLOCKED: a waiter unblocked by
-- a role change), before the C transport reconnects, and when the watch
-- heard something.
--
-- The watch (plain Lua: a C thread, core.sentinel_watch; OpenResty: a timer
-- per worker and master, redislock/ngx_watch.lua) stays subscribed
-- to +switch-master on one sentinel. Sentinels announce a switch about a
-- second after a failover starts, while the old master goes on accepting
-- writes for seconds more until it is reconfigured; so before each command
-- the client compares the watch's count (one atomic read) and resolves again
-- when it moved. A resolution after a switch was heard (and nothing else
-- since: watch:heard()) tries the master it announced first, and takes it
-- when it says ROLE master, before any sentinel is asked: a sentinel that
-- has not learned of the switch yet (they learn from each other every 2 s,
-- later when cut off) still names the old master, which still says ROLE
-- master. So once the switch was heard, no lock is taken on the demoted
-- master while the announced one says it is the master. The watch also
-- moves the watchdog's renewals to the new master at once. A command is
-- never sent twice to a new master: the wait loop's next try is the acquire
-- script, which reconciles by token.

local args = require("redislock.args")
local core = require("redislock.core")
local errors = require("redislock.errors")
local transport = require("redislock.transport")
local url = require("redislock.url")

local ipairs, pairs, setmetatable, tonumber, tostring, type = ipairs, pairs, setmetatable, tonumber, tostring, type
local math_floor, math_min = math.floor, math.min
local string_format, table_concat, table_insert, table_remove = string.format, table.concat, table.insert,
      table.remove

local where, now = url.where, core.now
local retry, error_class = errors.retry, errors.class

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

-- A node that does not say ROLE master is asked about this many times, with
-- pauses of 0.1 s, 0.2 s ... between (the sentinels may not have caught up).
local ROLE_TRIES = 5
local ROLE_PAUSE = 0.1

-- A wait blocks this long at most before it looks for a switch (see
-- Sentinel:wait; Redis ends a timed-out BLPOP at its next tick, 0.1 s later).
local WAIT_BLOCK_MS = 500

local Sentinel = {}
local sentinel_mt = { __index = Sentinel }

sentinel_mt.__tostring = function(self)
  return string_format("redislock.Client (master %q via %d sentinels)", self.master, #self.sentinels)
end

--- A transport for the master named master by the sentinels (a list of
-- { host =, port = }), and the sleep that goes with it. node: the fields of
-- the data nodes (as transport.node takes them; host and port come from the
-- sentinels). auth: { username, password, tls } for the sentinels (tls:
-- redislock/tls.lua's settings or nil). No I/O.
function _M.new(node, sentinels, master, auth)
  local self = setmetatable({ master = master, sentinels = {}, _fields = node, _stale = true, _seen = -1 },
                            sentinel_mt)
  -- Under OpenResty nginx checks DNS names only, and sentinels name nodes
  -- by address.
  transport.check_names(node.tls, "under OpenResty, TLS to the nodes behind Sentinel needs 'tls.server_name' (a"
    .. " DNS name in the nodes' certificates): the sentinels give addresses, and nginx checks DNS names only")
  for _, s in ipairs(sentinels) do
    transport.check_names(auth.tls, "under OpenResty, 'sentinel_tls' to sentinels given as addresses needs"
      .. " 'sentinel_tls.server_name' (a DNS name in their certificates): nginx checks DNS names only", s.host)
  end
  -- Every new connection to the master checks its ROLE where connections
  -- are pooled (redislock/ngx_conn.lua's open; the C transport checks
  -- when it resolves the master, below).
  node.master_only = true
  local sleep
  for i, s in ipairs(sentinels) do
    local t
    t, sleep = transport.node({ host = s.host, port = s.port, username = auth.username, password = auth.password,
                                tls = auth.tls, connect_timeout_ms = node.connect_timeout_ms,
                                timeout_ms = node.timeout_ms, prefix = node.prefix })
    self.sentinels[i] = { host = s.host, port = s.port, t = t }
  end
  self._sleep = sleep
  return self, sleep
end

-- Asks the sentinels in order for the master's address; the first that
-- answers moves to the front. host, port, or nil and an error message.
local function ask(self)
  local problems, unknown, refused = {}, false, false
  for i, s in ipairs(self.sentinels) do
    local reply, err = s.t:command("SENTINEL", "get-master-addr-by-name", self.master)
    if type(reply) == "table" and type(reply[1]) == "string" and tonumber(reply[2]) then
      if i > 1 then table_insert(self.sentinels, 1, table_remove(self.sentinels, i)) end
      return reply[1], tonumber(reply[2])
    elseif reply ~= nil then
      unknown = true
      problems[#problems + 1] = where(s.host, s.port) .. " does not know it"
    else
      refused = refused or not errors.connection(err) -- it answered, with an error (NOAUTH ...)
      problems[#problems + 1] = err
    end
  end
  local said = table_concat(problems, "; ")
  if unknown then
    return nil, string_format("redis: no sentinel knows master %q (%s)", self.master, said)
  elseif refused then
    return nil, string_format("redis: no sentinel would say where master %q is (%s)", self.master, said)
  end
  return nil, string_format("connection: no sentinel reachable for master %q (%s)", self.master, said)
end

-- Points the node transport at host:port (made on first use); the leases
-- renewed on the old master move along (retarget).
local function point(self, host, port)
  local node = self._node
  if node == nil then
    local fields = {}
    for k, v in pairs(self._fields) do fields[k] = v end
    fields.host, fields.port, fields.path = host, port, nil
    self._node = transport.node(fields)
  elseif self._host ~= host or self._port ~= port then
    node:retarget(host, port)
  end
  self._host, self._port = host, port
  return self._node
end

-- The watch, started on first use: a C thread in plain Lua, a timer per
-- worker and master under OpenResty (redislock/ngx_watch.lua). Returns it,
-- or nil and why it could not start.
local function watch(self)
  if self._watch == nil then
    local ts = {}
    for i, s in ipairs(self.sentinels) do ts[i] = s.t end
    local err
    self._watch, err = transport.watch(self.master, ts, self)
    if not self._watch then return nil, err end
  end
  return self._watch
end

--- A switch was announced (the OpenResty watch calls this from its timer):
-- the node transport, and the leases renewed on it, go to the new master
-- at once; the next command checks it (ROLE) as the count moved.
function Sentinel:switched(host, port)
  if self._node and not self._closed then
    self._node:retarget(host, port)
    self._host, self._port = host, port
  end
end

-- The role a node says it has, from what its ROLE answered (reply, or nil
-- and err): a refusal of a new OpenResty connection to a node that is no
-- master (class "demoted", redislock/ngx_conn.lua) keeps the role it
-- heard in the node's last_role; nil when none was heard.
local function role_of(node, reply, err)
  if reply == nil then return error_class(err) == "demoted" and node.last_role or nil end
  return type(reply) == "table" and reply[1] or tostring(reply)
end

-- The node transport of the master the last switch the watch w heard
-- announced (watch:heard()), when it says ROLE master; else nil (none
-- heard, or not the master now: the sentinels are asked).
local function announced(self, w)
  local host, port = w:heard()
  if not host then return nil end
  local node = point(self, host, port)
  local reply, err = node:command("ROLE")
  if role_of(node, reply, err) == "master" then return node end
end

-- Resolves the master (see above): the node transport, or nil and an error.
local function resolve(self)
  local w, werr = watch(self)
  local role
  if not w then return nil, werr end
  self._seen = w:count() -- taken before asking: a switch meanwhile asks again
  local node = announced(self, w)
  if node then
    self._stale = false
    return node
  end
  for try = 1, ROLE_TRIES do
    local host, port = ask(self)
    if not host then return nil, port end
    node = point(self, host, port)
    local reply, err = node:command("ROLE")
    if reply == nil and not retry(err, "resend") then return nil, err end
    role = role_of(node, reply, err)
    if role == "master" then
      self._stale = false
      return node
    end
    if try < ROLE_TRIES then self._sleep(ROLE_PAUSE * try) end
  end
  self._stale = true
  return nil, string_format("redis: READONLY %s, named master %q by the sentinels, says ROLE %s, not master "
                            .. "(asked %d times)",
                            where(self._host, self._port), self.master, tostring(role), ROLE_TRIES)
end

-- The node transport of the master now, or nil and an error. A node whose
-- next call would open a new connection (not usable: the last one was
-- closed by the server while idle, or in a forked child) asks the
-- sentinels first.
local function current(self)
  local w, node = self._watch, self._node
  if self._stale or (w and w:count() ~= self._seen) or not node:usable() then
    return resolve(self)
  end
  return node
end

-- After a failed call: resolve again before the next when the failure says
-- the node may be gone or no longer the master (redislock/errors.lua's
-- "resolve"). true when nothing was sent ("resend"): a new OpenResty
-- connection found the node demoted (redislock/ngx_conn.lua's open,
-- master_only), or the C node found its connection closed by the server
-- before the call's first bytes (it opens no other within a call:
-- rl_conn.h's ask_first); the call may then be made again at once, on the
-- master resolved again.
local function check(self, err)
  if retry(err, "resolve") then self._stale = true end
  return retry(err, "resend")
end

-- Makes a call (method of the node transport) on the master, and once more
-- on the master resolved again when a new connection found the node demoted
-- before anything was sent. Returns what the call returned.
local function call(self, method, ...)
  local node, err = current(self)
  if not node then return nil, err end
  local a, b, c, d = node[method](node, ...)
  if a == nil and check(self, b) then
    node, err = current(self)
    if not node then return nil, err end
    a, b, c, d = node[method](node, ...)
    if a == nil then check(self, b) end
  end
  return a, b, c, d
end

function Sentinel:eval(...)
  return call(self, "eval", ...)
end

--- sentinel:wait(key, token, ms[, op]): the node transport's wait, in
-- blocks of at most WAIT_BLOCK_MS. A waiter blocked on a master that was
-- just replaced would hear nothing (the release pushes its signal on the
-- new master, and the old one unblocks it only when it is reconfigured,
-- seconds later): after each block it looks at the watch, and a switch
-- heard since it resolved ends the wait as a wake-up, so that its next try
-- goes to the new master.
function Sentinel:wait(key, token, ms, op)
  local deadline = now() + ms / 1000
  while true do
    local block = math_min(ms, WAIT_BLOCK_MS)
    local woken, err = call(self, "wait", key, token, block, op)
    if woken ~= false then return woken, err end
    local w = self._watch
    if w and w:count() ~= self._seen then return true end
    ms = math_floor((deadline - now()) * 1000)
    if ms < 1 then return false end
  end
end

function Sentinel:command(...)
  return call(self, "command", ...)
end

function Sentinel:script(...)
  return call(self, "script", ...)
end

--- The node a lock's lease renews on (redislock/lease.lua): the master's
-- transport the lock was just taken through (no I/O; a switch moves its
-- leases with it: retarget, and the C watch thread's rl_watchdog_move).
function Sentinel:lease_nodes()
  return { self._node }, 1
end

function Sentinel:close()
  if self._watch then self._watch:close(self) end
  if self._node then self._node:close() end
  for _, s in ipairs(self.sentinels) do s.t:close() end
  self._closed = true
end

function Sentinel:closed()
  return self._closed == true
end

function Sentinel:io_problem()
  local t = self.sentinels[1].t
  return t.io_problem and t:io_problem()
end

return _M
