-- SPDX-License-Identifier: MIT
-- The Cluster phase of make torture (TORTURE_TOPOLOGY=cluster): three masters
-- with a replica each (cluster-node-timeout 1000 ms, every node with its
-- append-only file, fsync always), and the faults that hit such a cluster:
--  * a master cut off from the other nodes while the clients still reach
--    it: it grants locks until it sees it is in the minority (a node
--    timeout), while its replica is promoted on the majority side (a
--    partition: iptables in the suite's network namespace);
--  * before that, now and then, its replica's link stalled first, so that
--    the failover loses the master's last writes;
--  * a master killed (SIGKILL) and started again with its data, or paused
--    (SIGSTOP) past the node timeout; a replica paused;
--  * CLUSTER FAILOVER on a replica (coordinated; now and then FORCE, without
--    the master's agreement);
--  * a lock's slot moved to another master while sections run on it
--    (SETSLOT IMPORTING/MIGRATING, the keys MIGRATEd after a pause, SETSLOT
--    NODE: the clients meet ASK and TRYAGAIN, then MOVED);
--  * a master's clients killed (CLIENT KILL).
-- Every node has a loopback address of its own (127.0.0.11 ... 16), which
-- needs the namespace run.sh makes as root; elsewhere they share 127.0.0.1
-- and the partitions are left out (said in the log).
local helpers = require("spec.helpers")
local core = require("redislock.core")
local proc = require("torture.proc")

-- The module is the group's class: start makes a group.
local Group = {}
Group.__index = Group

local NODE_TIMEOUT = 1000 -- ms

--- Starts the cluster; returns the group. own: every node on its own address.
function Group.start(own, nkeys)
  local c = helpers.start_cluster({ node_timeout = NODE_TIMEOUT, own_addresses = own, full_coverage = false,
                                    extra = { "--appendonly", "yes", "--appendfsync", "always" } })
  local g = setmetatable({ c = c, own = own, nkeys = nkeys, moving = nil }, Group)
  g.where = "cluster=" .. table.concat(c.seeds, ",")
  return g
end

-- The running nodes that say they are masters.
function Group:masters()
  local out = {}
  for _, n in ipairs(self.c.nodes) do
    if n.pid and n:cli("ROLE"):match("^master") then out[#out + 1] = n end
  end
  return out
end

-- A master picked at random, or nil.
function Group:a_master()
  local m = self:masters()
  return m[1] and m[math.random(#m)]
end

-- The running replica of master m, or nil.
function Group:replica(m)
  local ok, r = pcall(self.c.replica_of, self.c, m)
  return ok and r or nil
end

--- Whether key exists on any master (a key of another slot answers MOVED).
function Group:exists(key)
  for _, m in ipairs(self:masters()) do
    if m:cli("EXISTS", key) == "1" then return true end
  end
  return false
end

-- Kills node n (SIGKILL), waits until it is gone, and starts it again s
-- seconds later with its own command: its data from its append-only file,
-- its place in the cluster from its nodes.conf.
local function kill_and_start(n, s)
  local pid = n.pid
  os.execute("kill -9 " .. pid .. " 2>/dev/null")
  n.pid = nil
  helpers.eventually(10, function() return not helpers.sh_ok("kill -0 " .. pid .. " 2>/dev/null") end)
  core.sleep(s)
  os.remove(n.dir .. "/redis.pid")
  helpers.run(n.cmd)
  n.pid = helpers.eventually(10, function()
    local p = tonumber(helpers.read_file(n.dir .. "/redis.pid") or "")
    return p and n:cli("PING") == "PONG" and p
  end)
  assert(n.pid, "a cluster node did not come back: " .. (helpers.read_file(n.dir .. "/redis.log") or ""):sub(-500))
end

-- A fault: a master picked at random, or its replica (role "master" or
-- "replica"), paused (SIGSTOP) for 0.5 s and up to longest s more.
local function paused(g, role, longest)
  return function()
    local m = g:a_master()
    local n = m and (role == "master" and m or g:replica(m))
    if not n then return "no " .. role .. ": nothing to pause" end
    return proc.pause_server(role, n, 0.5 + longest * math.random())
  end
end

--- The faults, each a function that returns a line for the log.
function Group:faults()
  local g, c = self, self.c
  local list = {
    function()
      local m = g:a_master()
      if not m then return "no master: nothing to cut off" end
      local r = g:replica(m)
      local stall = r and math.random(2) == 1
      if stall then
        -- Its replica falls behind first: the failover then loses writes.
        helpers.drop_between("-A", m.host, r.host)
        core.sleep(0.3 + 0.7 * math.random())
        helpers.drop_between("-D", m.host, r.host)
      end
      local s = 2 + 3 * math.random()
      c:isolate(m)
      core.sleep(s)
      c:heal(m)
      return string.format("master :%d cut off from the other nodes for %.2f s%s", m.port, s,
                           stall and " (its replica's link stalled first)" or "")
    end,
    function()
      local m = g:a_master()
      if not m then return "no master: nothing to kill" end
      local s = 0.5 + 3 * math.random()
      kill_and_start(m, s)
      return string.format("master :%d killed (SIGKILL), started again %.2f s later", m.port, s)
    end,
    paused(g, "master", 3),
    paused(g, "replica", 2),
    function()
      local m = g:a_master()
      local r = m and g:replica(m)
      if not r then return "no replica: no failover to ask for" end
      local force = math.random(3) == 1
      local said = r:cli("CLUSTER", "FAILOVER", force and "FORCE" or nil)
      local done = helpers.eventually(5, function() return r:cli("ROLE"):match("^master") ~= nil end)
      return string.format("CLUSTER FAILOVER%s on replica :%d of :%d: %s, %s", force and " FORCE" or "", r.port,
                           m.port, said, done and "promoted" or "not promoted within 5 s")
    end,
    function()
      if g.moving then
        -- A move that failed half-way is finished first (or tried again later).
        local mv = g.moving
        local ok, err = g:finish_move()
        return string.format("slot %d's move from :%d to :%d finished%s", mv.slot, mv.from.port, mv.to.port,
                             ok and "" or " (not yet): " .. tostring(err):gsub("\n", " "))
      end
      if not c:settled(1) then return "slot move skipped: the cluster is not settled" end
      local key = "k" .. math.random(g.nkeys)
      local slot = core.lock_slot(key)
      local from = c:owner(slot)
      local to = c:other_master(from)
      local pause = 0.2 + 0.8 * math.random()
      g.moving = { slot = slot, from = from, to = to }
      local ok, err = pcall(c.begin_move, c, slot, from, to)
      if ok then
        core.sleep(pause) -- new names of the slot go to the target (ASK), old ones stay
        ok, err = g:finish_move()
      end
      return string.format("slot %d (lock %s) moved from :%d to :%d, its keys %.2f s after the move began%s", slot,
                           key, from.port, to.port, pause, ok and "" or ": " .. tostring(err):gsub("\n", " "))
    end,
    function()
      local m = g:a_master()
      if not m then return "no master: no clients to kill" end
      return string.format("CLIENT KILL TYPE normal on master :%d: %s", m.port,
                           m:cli("CLIENT", "KILL", "TYPE", "normal"))
    end,
  }
  if not g.own then table.remove(list, 1) end -- no partitions without addresses of their own
  return list
end

--- Finishes the slot move under way (self.moving): its keys MIGRATEd, then
-- SETSLOT NODE; true, or false and why (the move stays to finish later).
function Group:finish_move()
  local mv = self.moving
  local ok, err = pcall(function()
    self.c:move_keys(mv.slot, mv.from, mv.to)
    self.c:end_move(mv.slot, mv.from, mv.to)
  end)
  if ok then self.moving = nil end
  return ok, err
end

--- After the faults: every cut healed, a move left half done finished
-- (if it can be); waits until every node agrees on the slots (true) or 30 s (false).
function Group:settle()
  for n in pairs(self.c.isolated or {}) do self.c:heal(n) end
  if self.moving then self:finish_move() end
  -- Settled: the nodes agree on the slots, and none is left half moved.
  return self.c:settled(30) and helpers.eventually(5, function()
    for _, n in ipairs(self.c.nodes) do
      if n.pid and n:cli("CLUSTER", "NODES"):find("%[%d+%-[<>]%-") then return false end
    end
    return true
  end)
end

--- Stops every node, by PID; with keep (a folder), copies their logs there first.
function Group:stop(keep)
  for n in pairs(self.c.isolated or {}) do self.c:heal(n) end
  proc.stop_servers(self.c.nodes, keep)
end

return Group
