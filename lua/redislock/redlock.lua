-- SPDX-License-Identifier: MIT
--- redislock.redlock: Redlock over N independent masters, as a transport (the
-- interface in redislock/transport.lua) over one node transport per server.
-- Written once for both transports; the calls go to every server at once
-- (plain Lua: core.eval_many, one poll() over all the sockets; OpenResty: a
-- light thread per server).
--
-- A lock is held when a majority (floor(N/2)+1) of the servers took it and
-- its validity, ttl - elapsed - drift (drift = 1 % of the ttl + 2 ms), is
-- still positive. On each server the lock is exactly a single-server lock
-- (the same key, holder's fence and token), so a single-server client on
-- any of them sees and respects it.
--
-- The fence, in two phases. Phase 1: the acquire script on every server
-- answers that server's next fence (its clock, or above its slot's fence
-- record: csrc/scripts/README.md, "Fences"); F = the largest among the
-- majority. Phase 2: on every server, only where the lock still holds our
-- token, the record is raised to at least F (fence_up); F stands only if a
-- majority confirms. Phase 2 is skipped when a majority answered F itself:
-- their records reached F while our lock was there, which is all it would
-- do. Why it grows across quorums: two majorities share a server. When B
-- takes the lock after A held it, some server s confirmed A's F_A in phase
-- 2 (A's majority) and granted B in phase 1 (B's majority); s raised its
-- record to >= F_A before A's lock on s ended (phase 2 needs our token
-- there), and B's grant on s came after that lock ended, so F_B >=
-- record(s) + 1 > F_A. The write-back is conditional because an
-- unconditional one would let a paused, expired A push its stale F past
-- B's. A server restarted without its data starts from its clock, above
-- every fence it handed out before (as long as the servers' clocks agree
-- to within the time a restart takes: docs/guarantees.md).

local args = require("redislock.args")
local backoff = require("redislock.backoff")
local core = require("redislock.core")
local transport = require("redislock.transport")
local url = require("redislock.url")

local ipairs, setmetatable, tonumber, tostring = ipairs, setmetatable, tonumber, tostring
local string_format, table_concat, table_sort = string.format, table.concat, table.sort
local math_floor, math_max, math_min = math.floor, math.max, math.min
local now, token, where, each = core.now, core.token, url.where, transport.each

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

-- What a Redlock client refuses, and why (for the acquire options).
_M.REFUSES = {
  fair = "a fair queue lives on one server; Redlock has no single queue to keep",
  replicas = "Redlock's servers are independent masters; replicas and WAIT belong to one server",
  primitives = "its scripts count holders on one server; use a client of one server, Sentinel or a cluster",
  delay_ms = "a lock's validity is reckoned from the TTL each server keeps, which a delay would lengthen",
}

-- A waiter retries after a random pause in this range (seconds): a release
-- on a majority cannot wake one waiter.
local PAUSE_MIN, PAUSE_MAX = 0.005, 0.05

local per_server, note_grants -- below

local Redlock = {}
local redlock_mt = { __index = Redlock }

--- No handoff (redislock/wait.lua): a release reaches a majority, each
-- server on its own, and a lock handed over on some of them would be held
-- on none. Its waiters find the lock free after a pause (Redlock:wait).
Redlock.handoff = false

redlock_mt.__tostring = function(self)
  return string_format("redislock.Client (Redlock over %d servers: %s)", self.n, table_concat(self.where, ", "))
end

--- The drift allowed for a lock of ms milliseconds: 1 % of it plus 2 ms.
local function drift(ms)
  return math_floor(ms / 100) + 2
end

--- A transport over the servers (a list of node fields, as transport.node
-- takes them), and the sleep that goes with it. timeout_ms: each server's
-- bound per call. No I/O.
function _M.new(servers, timeout_ms)
  local self = setmetatable({ nodes = {}, where = {}, n = #servers, _timeout_ms = timeout_ms,
                              refuses = _M.REFUSES, _grants = {}, _grants_n = 0, spread = true }, redlock_mt)
  self.quorum = math_floor(self.n / 2) + 1
  local sleep
  for i, f in ipairs(servers) do
    f.timeout_ms = timeout_ms
    self.nodes[i], sleep = transport.node(f)
    self.where[i] = f.path and "unix:" .. f.path or where(f.host or "127.0.0.1", f.port or 6379)
  end
  self._sleep = sleep
  return self, sleep
end

-- Runs op on every server at once (transport.each).
local function all(self, timeout_ms, op, key, tok, ms)
  return each(self.nodes, timeout_ms, op, key, tok, ms)
end

-- The errors among values (statuses false), as one text naming the servers.
local function errors(self, statuses, values)
  local out = {}
  for i = 1, self.n do
    if statuses[i] == false then out[#out + 1] = self.where[i] .. ": " .. values[i] end
  end
  return table_concat(out, "; ")
end

-- Counts statuses: held (1), free (0), other (-1), failed (false).
local function count(statuses, n)
  local held, free, other, failed = 0, 0, 0, 0
  for i = 1, n do
    local s = statuses[i]
    if s == 1 then
      held = held + 1
    elseif s == 0 then
      free = free + 1
    elseif s == -1 then
      other = other + 1
    else
      failed = failed + 1
    end
  end
  return held, free, other, failed
end

-- The "connection: ..." error when fewer than a majority answered.
local function unreachable(self, statuses, values, failed)
  return string_format("connection: reached %d of %d Redlock servers, fewer than the %d a majority needs (%s)",
                       self.n - failed, self.n, self.quorum, errors(self, statuses, values))
end

-- The bound of each server's answer to a call about a lock of ms
-- milliseconds (nil: none): the client's timeout, at most a tenth of the
-- ttl (at least 10 ms), so that a stopped server cannot eat the validity.
function per_server(self, ms)
  if not ms then return self._timeout_ms end
  return math_min(self._timeout_ms, math_max(10, math_floor(ms / 10)))
end

-- Keeps which servers confirmed the lock of token tok (for its lease: no
-- renewals where it was never taken). At most GRANTS_MAX are kept.
local GRANTS_MAX = 1024

function note_grants(self, tok, confirmed)
  if self._grants_n >= GRANTS_MAX then self._grants, self._grants_n = {}, 0 end
  local which = {}
  for i = 1, self.n do
    if confirmed[i] == 1 then which[#which + 1] = i end
  end
  self._grants[tok] = which
  self._grants_n = self._grants_n + 1
end

-- Takes back what note_grants kept for token tok: the list, or nil.
local function take_grants(self, tok)
  local which = self._grants[tok]
  if which then
    self._grants[tok] = nil
    self._grants_n = self._grants_n - 1
  end
  return which
end

-- Whether a lock of ms milliseconds whose call went out at start (core.now())
-- still has validity left: ttl - elapsed - drift > 0.
local function valid(ms, start)
  return ms - (now() - start) * 1000 - drift(ms) > 0
end

-- An acquire (see above): 1 and the fence; -1 and how long (ms) until
-- enough holders' locks run out to make a majority free; or nil and an
-- error. Whatever did not end held is released on every server.
local function acquire(self, key, tok, ms)
  local start, bound = now(), per_server(self, ms)
  local statuses, values = all(self, bound, "acquire", key, tok, ms)
  local held, free, _, failed = count(statuses, self.n)
  local fence = 0
  for i = 1, self.n do
    if statuses[i] == 1 and values[i] > fence then fence = values[i] end
  end
  if held >= self.quorum and valid(ms, start) then
    -- A server that answered F itself already has its record at F, set
    -- while our lock was there: when a majority did, phase 2 would change
    -- nothing.
    local at_f = 0
    for i = 1, self.n do
      if statuses[i] == 1 and values[i] == fence then at_f = at_f + 1 end
    end
    if at_f >= self.quorum then
      note_grants(self, tok, statuses)
      return 1, fence
    end
    local confirmed = all(self, bound, "fence_up", key, tok, fence)
    if count(confirmed, self.n) >= self.quorum and valid(ms, start) then
      note_grants(self, tok, confirmed)
      return 1, fence
    end
  end
  all(self, bound, "release", key, tok) -- also where it did not answer in time
  if self.n - failed < self.quorum then return nil, unreachable(self, statuses, values, failed) end
  -- Busy: the holders' PTTLs, shortest first; a majority is free once
  -- (quorum - free) of them ran out.
  local left = {}
  for i = 1, self.n do
    if statuses[i] == -1 then left[#left + 1] = values[i] end
  end
  table_sort(left)
  local need = self.quorum - free - held
  return -1, need >= 1 and left[need] or 0
end

-- A release or extend whose outcome a majority has not settled yet, while
-- servers refused it for a passing state (LOADING, BUSY ...: the command did
-- not run, redislock/backoff.lua's passing) that could settle it: asks those
-- servers again, after waiting's pause, until deadline (core.now()).
-- Updates statuses and values in place.
local function settle(self, deadline, statuses, values, bound, op, key, tok, ms)
  local step = backoff.FIRST
  while true do
    local have, retry, nodes = 0, {}, {}
    for i = 1, self.n do
      local s = statuses[i]
      if s == 1 or (s ~= false and op == "release") then
        have = have + 1 -- released (or found not ours), or extended
      elseif s == false and backoff.passing(values[i]) then
        retry[#retry + 1], nodes[#nodes + 1] = i, self.nodes[i]
      end
    end
    if have >= self.quorum or have + #retry < self.quorum then return end
    step = backoff.sleep(self._sleep, step, deadline - now(), true)
    if not step then return end
    local s, v = each(nodes, bound, op, key, tok, ms)
    for j, i in ipairs(retry) do statuses[i], values[i] = s[j], v[j] end
  end
end

-- eval, where a release or extend is settled (above) until deadline, if
-- given.
local function run(self, deadline, op, key, tok, ms)
  if op == "take" or op == "acquire" then return acquire(self, key, tok, ms) end
  if op == "acquire_fair" or op == "leave" then
    return nil, "redis: Redlock has no fair queue" -- refused at acquire already
  end
  local start, bound = now(), per_server(self, ms)
  local statuses, values = all(self, bound, op, key, tok, ms)
  -- An election's leader renews with elect_extend, an extend (redislock/election.lua).
  local extend = op == "extend" or op == "elect_extend"
  if deadline and (op == "release" or extend) then
    settle(self, deadline, statuses, values, bound, op, key, tok, ms)
  end
  local held, free, other, failed = count(statuses, self.n)
  if op == "release" then
    take_grants(self, tok)
    -- Released where it was ours; true once no majority can hold it.
    if held + free + other >= self.quorum then
      if held > 0 then return 1, 1 end
      return other >= self.quorum and -1 or 0, 0
    end
    return nil, unreachable(self, statuses, values, failed)
  elseif extend then
    -- Owner-checked everywhere (a server that lost the key does not get it
    -- back); held while a majority extended it within its validity.
    if held >= self.quorum and valid(ms, start) then return 1, ms end
    if held + failed >= self.quorum then return nil, unreachable(self, statuses, values, failed) end
    return other > free and -1 or 0, 0
  elseif op == "pttl" then
    -- The validity left: the quorum-th longest PTTL among the servers that
    -- hold it, less the drift.
    if held >= self.quorum then
      local left = {}
      for i = 1, self.n do
        if statuses[i] == 1 then left[#left + 1] = values[i] end
      end
      table_sort(left, function(a, b) return a > b end)
      return 1, math_max(0, left[self.quorum] - drift(left[self.quorum]))
    end
    if held + failed >= self.quorum then return nil, unreachable(self, statuses, values, failed) end
    return other > free and -1 or 0, 0
  end
  return nil, "redis: Redlock cannot run " .. tostring(op)
end

function Redlock:eval(op, key, tok, ms)
  return run(self, nil, op, key, tok, ms)
end

--- eval, where servers that refused a release or extend for a passing
-- state are asked again until deadline (core.now()) while no majority has
-- settled it (redislock/backoff.lua's again calls this in place of its own
-- loop, which would send it again to every server: one that released
-- already would then answer "not ours").
function Redlock:eval_until(deadline, op, key, tok, ms)
  return run(self, deadline, op, key, tok, ms)
end

--- A waiter's pause: a release on a majority wakes nobody, so a waiter
-- tries again after a random pause (never longer than ms). true.
function Redlock:wait(_, _, ms)
  local r = PAUSE_MIN + (PAUSE_MAX - PAUSE_MIN) * tonumber(token():sub(1, 6), 16) / 0x1000000
  self._sleep(math_min(ms / 1000, r))
  return true
end

--- No plain commands: there is no one server to run them on.
function Redlock.command(_, name)
  return nil, string_format("redis: %s: a Redlock client has no single server for plain commands; use a client"
                            .. " of the server you mean", tostring(name))
end

--- No scripts of one server's either (an election's, the admin's, guarded
-- writes: see each).
function Redlock.script(_, op)
  return nil, string_format("redis: %s: a Redlock client has no single server for this script; use a client"
                            .. " of the server you mean", type(op) == "string" and op or "a guard's script")
end

--- The nodes a lock's lease renews on (redislock/lease.lua): the servers
-- where it was taken (a stopped server renews nothing), held while a
-- majority of them is, less the drift.
function Redlock:lease_nodes(_, tok)
  local which, nodes = take_grants(self, tok), {}
  for i = 1, which and #which or self.n do nodes[i] = self.nodes[which and which[i] or i] end
  return nodes, self.quorum, drift
end

--- The validity of a lock of ms milliseconds just taken or extended.
function Redlock.validity_ms(_, ms)
  return ms - drift(ms)
end

function Redlock:close()
  for _, t in ipairs(self.nodes) do t:close() end
  self._closed = true
end

function Redlock:closed()
  return self._closed == true
end

function Redlock:io_problem()
  local t = self.nodes[1]
  return t.io_problem and t:io_problem()
end

_M.drift = drift

return _M
