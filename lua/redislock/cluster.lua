-- SPDX-License-Identifier: MIT
--- redislock.cluster: Redis Cluster, as a transport (the interface in
-- redislock/transport.lua) over one node transport per node used (opened
-- lazily; under OpenResty each has its own pool). Written once for both
-- transports.
--
-- Every name a lock's scripts use shares the lock's hash tag
-- ("<prefix>{<key>}", "<prefix>{<key>}:fence" ...), so a lock lives in one
-- slot, computed by the C core (core.lock_slot, CRC16 of the tag). The slot
-- table comes from CLUSTER SLOTS of any reachable node (the nodes used so
-- far, then the seeds), on first use and again after a MOVED or a failed
-- connection. Redirects (core.redirect parses them):
--
--   MOVED  the slot has a new owner: the table is refreshed and the call
--          made there (a MOVED reply means nothing ran);
--   ASK    the slot is being moved: the one call goes to the node named,
--          after ASKING on the same connection (also the EVAL after a
--          NOSCRIPT there), the table unchanged; a take goes as the acquire
--          script (a transaction after ASKING would be refused whole);
--   TRYAGAIN, CLUSTERDOWN
--          a multi-key script met a slot half moved (some of its keys on
--          one node, some on the other), or the cluster lost a master: a
--          lock's acquire asks the lock's key alone (pttl: one key is never
--          TRYAGAIN) and answers busy when another owner holds it; else an
--          acquire gives the error back to its wait loop, which retries
--          within the caller's wait (redislock/wait.lua TRANSIENT); a
--          release goes again at once as release_one, the compare-and-delete
--          of the lock's key alone (a read hold's, a write hold's and a
--          permit's likewise; one key is never TRYAGAIN; its waiters
--          are not woken but find it free by the bound of their wait); the
--          other calls without a wait retry here, with a doubling pause,
--          within the client's timeout.
--
-- At most MAX_REDIRECTS redirects per call; then an error naming the slot.
-- A resend after a failure whose outcome is unknown is never made here: the
-- wait loop's next try is the acquire script with the same token, which
-- reconciles.

local args = require("redislock.args")
local core = require("redislock.core")
local errors = require("redislock.errors")
local transport = require("redislock.transport")
local url = require("redislock.url")

local ipairs, next, pairs, select, setmetatable, tonumber, tostring, type = ipairs, next, pairs, select,
      setmetatable, tonumber, tostring, type
local string_format, table_concat = string.format, table.concat
local math_min = math.min
local now, lock_slot, slot_of, redirect = core.now, core.lock_slot, core.slot, core.redirect

local where = url.where
local error_class, retry, connection = errors.class, errors.retry, errors.connection

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

local MAX_REDIRECTS = 5

-- A refresh after a MOVED is skipped when the table is younger (seconds):
-- the MOVED's own answer is used meanwhile.
local REFRESH_GAP = 0.1

-- The pauses before retrying TRYAGAIN and CLUSTERDOWN (seconds).
local FIRST_PAUSE, MAX_PAUSE = 0.01, 0.2

-- Scripts that may wait: their TRYAGAIN goes back to the wait loop.
local ACQUIRES = { take = true, acquire = true, acquire_wait = true, acquire_fair = true, sem_acquire = true,
                   sem_acquire_wait = true, read_acquire = true, write_acquire = true, write_acquire_wait = true }

-- Releases and their forms on the hold's own key alone (see route).
local ONE_KEY = { release = "release_one", write_release = "write_release_one", read_release = "read_release_one",
                  sem_release = "sem_release_one" }

local Cluster = {}
local cluster_mt = { __index = Cluster }

cluster_mt.__tostring = function(self)
  return string_format("redislock.Client (cluster of %d seeds, %d nodes known)", #self.seeds, self._known)
end

--- A transport for the cluster whose nodes include seeds (a list of { host
-- =, port = }), and the sleep that goes with it. fields: of the nodes (as
-- transport.node takes them; host and port come from the cluster). No I/O.
function _M.new(fields, seeds)
  transport.check_names(fields.tls, "under OpenResty, TLS to a cluster needs 'tls.server_name' (a DNS name in the"
    .. " nodes' certificates): the cluster names its nodes by address, and nginx checks DNS names only")
  local self = setmetatable({ seeds = seeds, _fields = fields, _nodes = {}, _known = 0, _slots = {},
                              _loaded = nil, _stale = true, spread = true }, cluster_mt)
  self._timeout = (fields.timeout_ms or 1000) / 1000
  -- A transport never used for I/O: for the sleep, and io_problem.
  local probe, sleep = transport.node({ host = seeds[1].host, port = seeds[1].port })
  self._probe, self._sleep = probe, sleep
  return self, sleep
end

-- The node transport for host:port, made on first use.
local function node(self, host, port)
  local addr = where(host, port)
  local n = self._nodes[addr]
  if n == nil then
    local f = {}
    for k, v in pairs(self._fields) do f[k] = v end
    f.host, f.port, f.path = host, port, nil
    n = { t = transport.node(f), host = host, port = port, addr = addr }
    self._nodes[addr] = n
    self._known = self._known + 1
  end
  return n
end

-- Reads a CLUSTER SLOTS reply from the node n into the slot table. true, or
-- nil when the reply is not one.
local function load_slots(self, n, reply)
  local slots = {}
  for _, range in ipairs(reply) do
    local first, last, master = tonumber(range[1]), tonumber(range[2]), range[3]
    if not (first and last and type(master) == "table" and type(master[1]) == "string" and tonumber(master[2])) then
      return nil
    end
    -- An empty or "?" address: the node that answered (cluster-preferred-endpoint-type).
    local host = (master[1] == "" or master[1] == "?") and n.host or master[1]
    local owner = node(self, host, tonumber(master[2]))
    for s = first, last do slots[s] = owner end
  end
  self._slots, self._loaded, self._stale = slots, now(), false
  return true
end

-- Asks the nodes used so far, then the seeds, for the slot table; true, or
-- nil and an error message.
local function refresh(self)
  local asked, problems, refused = {}, {}, false
  local candidates = {}
  for _, n in pairs(self._nodes) do
    if not n.failed then candidates[#candidates + 1] = n end
  end
  for _, s in ipairs(self.seeds) do candidates[#candidates + 1] = { host = s.host, port = s.port } end
  for _, n in pairs(self._nodes) do -- those that failed lately last: each may cost a timeout
    if n.failed then candidates[#candidates + 1] = n end
  end
  for _, c in ipairs(candidates) do
    local n = node(self, c.host, c.port)
    if not asked[n] then
      asked[n] = true
      local reply, err = n.t:command("CLUSTER", "SLOTS")
      n.failed = reply == nil and connection(err)
      if type(reply) == "table" and #reply > 0 and load_slots(self, n, reply) then return true end
      if reply ~= nil then
        refused = true
        problems[#problems + 1] = n.addr .. " has no slots to tell"
      else
        refused = refused or not n.failed
        problems[#problems + 1] = err
      end
    end
  end
  self._stale = true
  local said = table_concat(problems, "; ")
  if refused then return nil, "redis: no cluster node would tell its slots (" .. said .. ")" end
  return nil, "connection: no cluster node reachable (" .. said .. ")"
end

-- The node that owns slot (refreshing the table when stale, or when it
-- names no owner), or nil and an error message.
local function owner(self, slot)
  local n = not self._stale and self._slots[slot]
  if not n then
    local ok, err = refresh(self)
    if not ok then return nil, err end
    n = self._slots[slot]
    if n == nil then return nil, string_format("redis: CLUSTERDOWN Hash slot %d is not served", slot) end
  end
  return n
end

-- After a failed call on node n for slot: what to do next. Returns "moved"
-- or "ask" and the node named, "retry" (TRYAGAIN, CLUSTERDOWN: the class
-- redislock/errors.lua retries "here"), or nil (give the error back; a
-- connection error, a demoted node or a cluster down refreshes the table
-- first on the next call: "resolve").
local function after(self, n, slot, err)
  if type(err) ~= "string" then return nil end
  local kind, _, host, port = redirect(err)
  if kind then
    local to = node(self, host == "" and n.host or host, port)
    if kind == "MOVED" then
      self._slots[slot] = to
      if not self._loaded or now() - self._loaded >= REFRESH_GAP then refresh(self) end
      return "moved", to
    end
    return "ask", to
  end
  if connection(err) then n.failed = true end
  if retry(err, "resolve") then self._stale = true end
  if retry(err, "here") then return "retry" end
  return nil
end

-- The error after too many redirects.
local function too_many(slot, err)
  return string_format("redis: slot %d was redirected %d times (%s); the cluster is being reconfigured",
                       slot, MAX_REDIRECTS, err)
end

-- Calls method(first, ...) of the node transport that owns slot, following
-- redirects; with retry_here, TRYAGAIN and CLUSTERDOWN are retried within
-- the client's timeout. For eval (first: the op), a take goes as the
-- acquire script after ASKING (a transaction after ASKING is refused
-- whole), and a release that met TRYAGAIN goes at once as its ONE_KEY form
-- (the hold's key alone, which a half-moved slot never refuses). Returns what
-- the method returned (its first value nil: failed).
local function route(self, slot, retry_here, method, first, ...)
  local n, err = owner(self, slot)
  if not n then return nil, err end
  local asking, redirects, pause, deadline = false, 0, FIRST_PAUSE, nil
  while true do
    if asking then
      n.t:asking()
      if method == "eval" and first == "take" then first = "acquire" end
    end
    local a, b, c, d = n.t[method](n.t, first, ...)
    if a ~= nil then
      -- The node a script last ran on (its port, as a Sentinel client's
      -- _port is its master's): make torture's history records it.
      if method == "eval" then self._port = n.port end
      return a, b, c, d
    end
    local what, to = after(self, n, slot, b)
    if what == "moved" or what == "ask" then
      redirects = redirects + 1
      if redirects > MAX_REDIRECTS then return nil, too_many(slot, b) end
      n, asking = to, what == "ask"
    elseif what == "retry" and method == "eval" and ONE_KEY[first] and error_class(b) == "tryagain" then
      first = ONE_KEY[first] -- on the same node, after ASKING again if it was asked
    elseif what == "retry" and method == "eval" and (first == "take" or first == "acquire")
           and error_class(b) == "tryagain" then
      -- Held by another owner, the lock answers busy with its PTTL, as the
      -- acquire script would; else the TRYAGAIN goes to the wait loop.
      local key, token = ...
      local status, left = route(self, slot, false, "eval", "pttl", key, token)
      if status == -1 then return -1, left end
      return a, b, c, d
    elseif what == "retry" and retry_here then
      deadline = deadline or now() + self._timeout
      if now() + pause > deadline then return nil, b end
      self._sleep(pause)
      pause = math_min(pause * 2, MAX_PAUSE)
      asking = false
      n, err = owner(self, slot)
      if not n then return nil, err end
    else
      return a, b, c, d
    end
  end
end

function Cluster:eval(op, key, token, ms, more)
  return route(self, lock_slot(key), not ACQUIRES[op], "eval", op, key, token, ms, more)
end

--- cluster:wait(key, token, ms[, op]): blocks on the node that owns the lock's
-- slot. A redirect (the slot moved, or is moving, while it waited) counts
-- as woken: the next try goes where the slot is now.
function Cluster:wait(key, token, ms, op)
  local slot = lock_slot(key)
  local n, err = owner(self, slot)
  if not n then return nil, err end
  local ok, werr = n.t:wait(key, token, ms, op)
  if ok == nil then
    local what = after(self, n, slot, werr)
    if what == "moved" or what == "ask" then return true end
  end
  return ok, werr
end

--- cluster:command(name, ...): on the node that owns the slot of the first
-- argument (the key, for most commands; a script's first key), or of the name when it has none;
-- redirects followed. Never resent after a failure whose outcome is unknown.
function Cluster:command(name, ...)
  local first = ...
  if type(name) == "string" and (name:upper() == "EVALSHA" or name:upper() == "EVAL") then
    first = select(3, ...) -- script, numkeys, first key
  end
  return route(self, slot_of(tostring(first or name)), true, "command", name, ...)
end

--- cluster:script(op, keys, ...): on the node that owns the slot of the
-- keys (a lock key's, or the first name's when the caller names them);
-- redirects followed, never resent.
function Cluster:script(op, keys, ...)
  local first = type(keys) == "table" and keys[1] or keys
  local named = type(op) == "table" or (core.scripts[op] or {}).named
  local slot = named and slot_of(tostring(first)) or lock_slot(tostring(first))
  return route(self, slot, true, "script", op, keys, ...)
end

--- The node a lock's lease renews on (redislock/lease.lua), through this
-- transport, which follows redirects (the watchdog follows them on its
-- own). No I/O (the lock was just taken): the node the table names for the
-- slot, or any known one while the table is being refreshed.
function Cluster:lease_nodes(key)
  local n = self._slots[lock_slot(key)] or select(2, next(self._nodes))
  return { n.t }, 1, nil, self
end

function Cluster:close()
  for _, n in pairs(self._nodes) do n.t:close() end
  self._closed = true
end

function Cluster:closed()
  return self._closed == true
end

function Cluster:io_problem()
  local t = self._probe
  return t.io_problem and t:io_problem()
end

return _M
