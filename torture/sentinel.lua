-- SPDX-License-Identifier: MIT
-- The Sentinel phase of make torture (TORTURE_TOPOLOGY=sentinel): a master,
-- two replicas and three sentinels (quorum 2, down-after-milliseconds 1000),
-- every node with its append-only file (fsync always), and the faults that
-- hit such a group:
--  * the master cut off from the replicas and the sentinels, while the
--    clients still reach it: the split brain in which a deposed master
--    grants locks (a partition: iptables in the suite's network namespace);
--  * before that, now and then, the replicas' links stalled first, so that
--    the failover loses the master's last writes;
--  * the master killed (SIGKILL) and started again, or paused (SIGSTOP) past
--    down-after-milliseconds;
--  * a replica paused, a sentinel cut off or killed and started again;
--  * the master's clients killed (CLIENT KILL);
--  * a failover undone: the master cut off from the group until the
--    sentinels promote a replica, the clients taking locks on it for 1 to 3
--    s, then the old master named again, never demoted (the sentinels
--    monitor it anew, the other nodes are made its replicas again): its
--    data unchanged, the promoted replica's locks gone.
-- Every node and sentinel has a loopback address of its own (127.0.0.11 ...,
-- 127.0.0.21 ...), which needs the namespace run.sh makes as root; elsewhere
-- they share 127.0.0.1 and the partitions are left out (said in the log).
local helpers = require("spec.helpers")
local core = require("redislock.core")
local proc = require("torture.proc")

local q = helpers.sh_quote

local _M = {}

local Group = {}
Group.__index = Group

-- Starts one sentinel on host watching the master at mhost:mport.
local function start_sentinel(host, mhost, mport)
  local dir = (helpers.run("mktemp -d " .. q((os.getenv("REDISLOCK_TEST_TMP") or "/tmp") .. "/sentinel.XXXXXX"))
    :gsub("%s+$", ""))
  local port = helpers.free_port()
  local lines = {
    -- Its links from its own address, and announced at it to the others.
    "port " .. port, "bind " .. host, "bind-source-addr " .. host, "sentinel announce-ip " .. host,
    "daemonize yes", "protected-mode no",
    "pidfile " .. dir .. "/sentinel.pid", "logfile " .. dir .. "/sentinel.log", "dir " .. dir,
    "sentinel monitor mymaster " .. mhost .. " " .. mport .. " 2",
    "sentinel down-after-milliseconds mymaster 1000",
    "sentinel failover-timeout mymaster 4000",
    "sentinel parallel-syncs mymaster 2",
  }
  local f = assert(io.open(dir .. "/sentinel.conf", "w"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  local s = { host = host, port = port, dir = dir,
              cmd = "redis-server " .. q(dir .. "/sentinel.conf") .. " --sentinel" }
  helpers.run(s.cmd)
  s.pid = helpers.eventually(5, function()
    local pid = tonumber(helpers.read_file(dir .. "/sentinel.pid") or "")
    return pid and (helpers.read_file(dir .. "/sentinel.log") or ""):find("+monitor master", 1, true) and pid
  end)
  assert(s.pid, "cannot start a sentinel: " .. (helpers.read_file(dir .. "/sentinel.log") or ""))
  return s
end

local function cli(host, port, ...)
  local args = { "redis-cli", "-h", host, "-p", port }
  for _, a in ipairs({ ... }) do args[#args + 1] = q(a) end
  return (helpers.run(table.concat(args, " ") .. " 2>&1"):gsub("\n$", ""))
end

--- Starts the group; returns it. own: every process on its own address.
function _M.start(own)
  local g = setmetatable({ nodes = {}, sentinels = {}, cuts = {}, own = own }, Group)
  local aof = { "--appendonly", "yes", "--appendfsync", "always" }
  local function node_host(i) return own and ("127.0.0.1" .. i) or "127.0.0.1" end
  g.nodes[1] = helpers.start_redis(aof, { host = node_host(1) })
  for i = 2, 3 do
    local extra = { "--replicaof", g.nodes[1].host, tostring(g.nodes[1].port) }
    for _, a in ipairs(aof) do extra[#extra + 1] = a end
    g.nodes[i] = helpers.start_redis(extra, { host = node_host(i) })
  end
  for i = 1, 3 do
    g.sentinels[i] = start_sentinel(own and ("127.0.0.2" .. i) or "127.0.0.1", g.nodes[1].host, g.nodes[1].port)
  end
  local addrs = {}
  for i, s in ipairs(g.sentinels) do addrs[i] = s.host .. ":" .. s.port end
  g.where = "sentinel=" .. table.concat(addrs, ",") .. "@mymaster"
  -- Ready once both replicas have their first copy of the master's data (a
  -- replica promoted before that has none of the locks) and every sentinel
  -- knows both replicas and the two other sentinels.
  assert(helpers.eventually(30, function()
    for i = 2, 3 do
      if not g.nodes[i]:cli("INFO", "replication"):find("master_link_status:up", 1, true) then return false end
    end
    for _, s in ipairs(g.sentinels) do
      local replicas = cli(s.host, s.port, "SENTINEL", "replicas", "mymaster")
      local others = cli(s.host, s.port, "SENTINEL", "sentinels", "mymaster")
      for i = 2, 3 do
        if not replicas:find(tostring(g.nodes[i].port), 1, true) then return false end
      end
      local n = 0
      for _ in ("\n" .. others):gmatch("\nrunid\n") do n = n + 1 end
      if n < 2 then return false end
    end
    return true
  end), "the sentinels never saw the replicas and each other")
  return g
end

--- The node the first answering sentinel names as master, or nil.
function Group:master()
  for _, s in ipairs(self.sentinels) do
    if s.pid then
      local port = tonumber(cli(s.host, s.port, "SENTINEL", "get-master-addr-by-name", "mymaster"):match("\n(%d+)$"))
      for _, n in ipairs(self.nodes) do
        if n.port == port then return n end
      end
    end
  end
end

--- redis-cli on the master now (over its unix socket: no partition cuts it).
function Group:cli(...)
  local m = self:master() or self.nodes[1]
  return m:cli(...)
end

--- Whether key exists on the master now.
function Group:exists(key)
  return self:cli("EXISTS", key) ~= "0"
end

-- Cuts host off the given hosts until heal(); returns the cut.
function Group:cut(host, others)
  local c = { host = host, others = others }
  for _, o in ipairs(others) do helpers.drop_between("-A", host, o) end
  self.cuts[c] = true
  return c
end

function Group:heal(c)
  if not self.cuts[c] then return end
  for _, o in ipairs(c.others) do helpers.drop_between("-D", c.host, o) end
  self.cuts[c] = nil
end

-- Every address of the group but host's.
function Group:all_but(host)
  local out = {}
  for _, n in ipairs(self.nodes) do if n.host ~= host then out[#out + 1] = n.host end end
  for _, s in ipairs(self.sentinels) do if s.host ~= host then out[#out + 1] = s.host end end
  return out
end

-- Kills a process by PID (SIGKILL) and waits until it is gone.
local function kill9(pid)
  os.execute("kill -9 " .. pid .. " 2>/dev/null")
  helpers.eventually(10, function() return not helpers.sh_ok("kill -0 " .. pid .. " 2>/dev/null") end)
end

-- Starts node n again with its own command (its data from its AOF), but
-- as a master, as a killed master comes back; the sentinels make it a
-- replica when another node is master by then.
local function start_again(n)
  os.remove(n.dir .. "/redis.pid")
  helpers.run((n.cmd:gsub("'%-%-replicaof' '[^']*' '[^']*' ?", "")))
  n.pid = helpers.eventually(10, function() return tonumber(helpers.read_file(n.dir .. "/redis.pid") or "") end)
end

--- The faults, each a function that returns a line for the log.
function Group:faults()
  local g = self
  local list = {
    function()
      local m = g:master()
      if not m then return "no master named now: nothing to cut" end
      local s = 1.5 + 2.5 * math.random()
      local stall = math.random(2) == 1
      local cuts = {}
      if stall then
        -- The replicas fall behind first: the failover then loses writes.
        for _, n in ipairs(g.nodes) do
          if n ~= m then cuts[#cuts + 1] = g:cut(m.host, { n.host }) end
        end
        core.sleep(0.3 + 0.7 * math.random())
      end
      cuts[#cuts + 1] = g:cut(m.host, g:all_but(m.host))
      core.sleep(s)
      for _, c in ipairs(cuts) do g:heal(c) end
      local now = g:master()
      return string.format("master :%d cut off from the group for %.2f s%s; master now :%s", m.port, s,
                           stall and " (its replicas' links stalled first)" or "", now and now.port or "?")
    end,
    function()
      local m = g:master()
      if not m then return "no master named now: nothing to kill" end
      kill9(m.pid)
      local s = 0.5 + 2.5 * math.random()
      core.sleep(s)
      start_again(m)
      return string.format("master :%d killed (SIGKILL), started again %.2f s later", m.port, s)
    end,
    function()
      local m = g:master()
      if not m then return "no master named now: nothing to pause" end
      return proc.pause_server("master", m, 0.5 + 2.5 * math.random())
    end,
    function()
      local m = g:master()
      local r = g.nodes[math.random(#g.nodes)]
      if r == m then return "replica pause skipped: picked the master" end
      return proc.pause_server("replica", r, 0.5 + 2 * math.random())
    end,
    function()
      local s = g.sentinels[math.random(#g.sentinels)]
      local t = 1 + 2 * math.random()
      if g.own and math.random(2) == 1 then
        local c = g:cut(s.host, g:all_but(s.host))
        core.sleep(t)
        g:heal(c)
        return string.format("sentinel :%d cut off for %.2f s", s.port, t)
      end
      kill9(s.pid)
      core.sleep(t)
      os.remove(s.dir .. "/sentinel.pid") -- a killed sentinel leaves it
      helpers.run(s.cmd)
      s.pid = helpers.eventually(10, function() return tonumber(helpers.read_file(s.dir .. "/sentinel.pid") or "") end)
      return string.format("sentinel :%d killed, started again %.2f s later", s.port, t)
    end,
    function()
      local m = g:master()
      if not m then return "no master named now: no clients to kill" end
      return "CLIENT KILL TYPE normal on the master: " .. m:cli("CLIENT", "KILL", "TYPE", "normal")
    end,
  }
  if not g.own then
    table.remove(list, 1) -- no partitions without addresses of their own
    return list
  end
  list[#list + 1] = function()
    local m = g:master()
    if not m then return "no master named now: no failover to undo" end
    local began = core.now()
    local cut = g:cut(m.host, g:all_but(m.host))
    -- The sentinels' own failover: a second for down-after-milliseconds,
    -- then their vote.
    local r = helpers.eventually(10, function()
      local now = g:master()
      return now ~= m and now
    end)
    if not r then
      g:heal(cut)
      return string.format("failover undone: none came in 10 s; master :%d cut off, then healed", m.port)
    end
    local promoted = core.now() - began
    local s = 1 + 2 * math.random()
    core.sleep(s)
    -- m named again, never demoted: the sentinels forget r's election, all
    -- of them at once, then monitor m anew (epoch 0), while m is still cut
    -- off from them, so that none can demote it. Not one after the other: a
    -- sentinel that still knew r's election would tell one that monitors m
    -- anew (their hellos), and r's epoch, higher, would win (make torture
    -- saw it, the calls 1.8 s apart under load). A client that asks in
    -- between (a few ms) is told no sentinel knows the master.
    local forget, monitor = {}, {}
    for i, x in ipairs(g.sentinels) do
      local to = "redis-cli -h " .. x.host .. " -p " .. x.port .. " SENTINEL "
      forget[i] = to .. "REMOVE mymaster &"
      monitor[i] = "(" .. to .. "MONITOR mymaster " .. m.host .. " " .. m.port .. " 2; " .. to .. "SET mymaster "
        .. "down-after-milliseconds 1000 failover-timeout 4000 parallel-syncs 2) &"
    end
    helpers.run(table.concat(forget, " ") .. " wait; " .. table.concat(monitor, " ") .. " wait")
    g:heal(cut)
    -- The other nodes, r among them, copy m again (r's locks are gone).
    for _, n in ipairs(g.nodes) do
      if n ~= m then n:cli("REPLICAOF", m.host, tostring(m.port)) end
    end
    local named = helpers.eventually(10, function()
      for _, x in ipairs(g.sentinels) do
        if not cli(x.host, x.port, "SENTINEL", "get-master-addr-by-name", "mymaster"):find("\n" .. m.port .. "$") then
          return false
        end
      end
      return true
    end)
    return string.format("failover undone: master :%d cut off, replica :%d promoted by the sentinels %.2f s later, "
                         .. "master for %.2f s; then :%d named again, never demoted (%s)", m.port, r.port, promoted,
                         s, m.port, named and "every sentinel names it" or "NOT named by every sentinel in 10 s")
  end
  return list
end

--- After the faults: every cut healed; waits until the sentinels agree on a
-- master that says it is one (true), or 30 s (false).
function Group:settle()
  for c in pairs(self.cuts) do self:heal(c) end
  return helpers.eventually(30, function()
    local port
    for _, s in ipairs(self.sentinels) do
      local p = tonumber(cli(s.host, s.port, "SENTINEL", "get-master-addr-by-name", "mymaster"):match("\n(%d+)$"))
      if not p or (port and p ~= port) then return false end
      port = p
    end
    local m = self:master()
    return m and m:cli("ROLE"):match("^master") ~= nil
  end)
end

--- Stops every process, by PID; with keep (a folder), copies their logs
-- there first.
function Group:stop(keep)
  for c in pairs(self.cuts) do self:heal(c) end
  if keep then
    for _, s in ipairs(self.sentinels) do
      os.execute("cp " .. q(s.dir .. "/sentinel.log") .. " " .. q(keep .. "/sentinel-" .. s.port .. ".log"))
    end
  end
  for _, s in ipairs(self.sentinels) do
    if s.pid then
      os.execute("kill -CONT " .. s.pid .. " 2>/dev/null; kill " .. s.pid .. " 2>/dev/null")
      s.pid = nil
    end
    os.execute("rm -rf " .. q(s.dir))
  end
  proc.stop_servers(self.nodes, keep)
end

return _M
