-- SPDX-License-Identifier: MIT
-- The Redlock phase of make torture (TORTURE_TOPOLOGY=redlock): five
-- independent servers, each with its append-only file (fsync always), and
-- the faults that hit them:
--  * a minority (one or two servers) or a majority (three) cut off from the
--    clients (a partition: iptables in the run's network namespace);
--  * a server killed and started again without its data (SIGKILL, files
--    removed) a TTL later (Redlock's delayed restart), or paused (SIGSTOP)
--    up to 1.5 TTLs;
--  * a server's clock jumped forward (torture/clock.lua): its locks expire
--    early. Kleppmann's case against Redlock, where two clients may both
--    hold a majority. The checker is told when: the silent overlaps during
--    a jump are counted apart, as what the design allows;
--  * a server's clients killed.
-- Every server has a loopback address of its own (127.0.0.31 ...), which
-- needs the namespace run.sh makes as root; elsewhere they share 127.0.0.1
-- and the partitions are left out.
local helpers = require("spec.helpers")
local clock = require("torture.clock")
local core = require("redislock.core")
local proc = require("torture.proc")

-- The module is the group's class: start makes a group.
local Group = {}
Group.__index = Group

--- Starts the five servers; returns the group. own: each on its own address.
function Group.start(own)
  local g = setmetatable({ servers = {}, cuts = {}, own = own, windows = {} }, Group)
  local urls = {}
  for i = 1, 5 do
    local host = own and ("127.0.0.3" .. i) or "127.0.0.1"
    local srv = helpers.start_redis({ "--appendonly", "yes", "--appendfsync", "always" }, { host = host })
    g.servers[i], urls[i] = srv, "redis://" .. host .. ":" .. srv.port
  end
  g.where = "redlock=" .. table.concat(urls, ",")
  return g
end

--- Whether key exists on any server.
function Group:exists(key)
  for _, s in ipairs(self.servers) do
    if s:cli("EXISTS", key) ~= "0" then return true end
  end
  return false
end

-- Adds (how "-A") or deletes ("-D") the rules that drop every packet
-- between the clients (127.0.0.1) and host, both ways.
local function rule(how, host)
  helpers.drop_between(how, "127.0.0.1", host)
end

-- n servers, picked at random.
local function some(list, n)
  local copy = { table.unpack(list) }
  local out = {}
  for _ = 1, n do out[#out + 1] = table.remove(copy, math.random(#copy)) end
  return out
end

--- The faults, each a function that returns a line for the log.
function Group:faults(ttl)
  local g = self
  local list = {
    function()
      local n = math.random(3)
      local cut = some(g.servers, n)
      local s = 1 + 2 * math.random()
      for _, srv in ipairs(cut) do rule("-A", srv.host) g.cuts[srv] = true end
      core.sleep(s)
      local ports = {}
      for _, srv in ipairs(cut) do
        rule("-D", srv.host)
        g.cuts[srv] = nil
        ports[#ports + 1] = ":" .. srv.port
      end
      return string.format("%s (%s) cut off from the clients for %.2f s", n == 3 and "a majority" or "a minority",
                           table.concat(ports, " "), s)
    end,
    function()
      local srv = g.servers[math.random(#g.servers)]
      local started = core.now()
      -- Down for a TTL first: Redlock's delayed restart, without which a
      -- server that forgot a lock lets another majority take it.
      srv:restart(function() core.sleep(ttl) end)
      helpers.eventually(10, function() return srv:cli("PING") == "PONG" end)
      return string.format("server :%d restarted without its data (kill -9, files removed, down a TTL), %.2f s",
                           srv.port,
                           core.now() - started)
    end,
    function()
      local srv = g.servers[math.random(#g.servers)]
      return proc.pause_server("server", srv, ttl * (0.3 + 1.2 * math.random()))
    end,
    function()
      local srv = g.servers[math.random(#g.servers)]
      return string.format("CLIENT KILL TYPE normal on :%d: %s", srv.port, srv:cli("CLIENT", "KILL", "TYPE", "normal"))
    end,
  }
  list[#list + 1] = function()
    return clock.jump(g.servers[math.random(#g.servers)], ttl, g.windows)
  end
  if not g.own then table.remove(list, 1) end -- no partitions without addresses of their own
  return list
end

--- After the faults: every cut healed, every server answering.
function Group:settle()
  for srv in pairs(self.cuts) do rule("-D", srv.host) end
  self.cuts = {}
  return helpers.eventually(10, function()
    for _, s in ipairs(self.servers) do
      if s:cli("PING") ~= "PONG" then return false end
    end
    return true
  end)
end

--- Stops every server, by PID; with keep (a folder), copies their logs there first.
function Group:stop(keep)
  for srv in pairs(self.cuts) do rule("-D", srv.host) end
  self.cuts = {}
  proc.stop_servers(self.servers, keep)
end

return Group
