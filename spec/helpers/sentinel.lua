-- SPDX-License-Identifier: MIT
-- spec/helpers.lua's Sentinel groups: a master, a replica and three
-- sentinels on loopback (helpers.start_sentinels), failovers, a master
-- demoted without a word (group:quiet_master), loops across a failover.
local core = require("redislock.core")

return function(helpers)
  local tmpdir, Server, run, sh_quote, read_file = helpers.tmpdir, helpers.Server, helpers.run, helpers.sh_quote,
        helpers.read_file

  local Group = {}
  Group.__index = Group

  --- Starts a Sentinel group on loopback: a master, a replica of it and three
  -- sentinels (quorum 2, down-after-milliseconds 1000, failover-timeout 5000)
  -- watching it as "mymaster", each by PID under a folder of its own. Returns
  -- once every sentinel knows the replica and the two other sentinels (until
  -- then SENTINEL FAILOVER answers NOGOODSLAVE). group.nodes = { master,
  -- replica } (Servers; which is master changes with a failover),
  -- group.sentinels = { Server-like { port, pid, dir } ... }, group.addrs =
  -- { "127.0.0.1:<port>", ... } (the sentinels, for the client option).
  -- Raises when it cannot start. opts.own_addresses: each process on an
  -- address of its own (the master 127.0.0.21, the replica .22, the
  -- sentinels .23 to .25), so that group:split can cut them apart (needs
  -- helpers.netns).
  -- Starts one sentinel watching master (a Server) as "mymaster" (quorum 2),
  -- with more configuration lines, on host (127.0.0.1 by default); returns
  -- it (a Server), or raises.
  local function start_sentinel(master, more, host)
    local dir, port = tmpdir(), helpers.free_port()
    host = host or "127.0.0.1"
    local lines = {
      "port " .. port, "bind " .. host, "daemonize yes",
      "pidfile " .. dir .. "/sentinel.pid", "logfile " .. dir .. "/sentinel.log", "dir " .. dir,
      "sentinel monitor mymaster " .. master.host .. " " .. master.port .. " 2",
      "sentinel down-after-milliseconds mymaster 1000",
      "sentinel failover-timeout mymaster 5000",
      "sentinel parallel-syncs mymaster 1" }
    -- Its own connections come from its own address too, which protected
    -- mode would take for a remote one.
    if host ~= "127.0.0.1" then
      lines[#lines + 1] = "bind-source-addr " .. host
      lines[#lines + 1] = "protected-mode no"
    end
    for _, l in ipairs(more or {}) do lines[#lines + 1] = l end
    local f = assert(io.open(dir .. "/sentinel.conf", "w"))
    f:write(table.concat(lines, "\n"), "\n")
    f:close()
    run("redis-server " .. sh_quote(dir .. "/sentinel.conf") .. " --sentinel")
    local up = helpers.eventually(5, function()
      local pid = tonumber(read_file(dir .. "/sentinel.pid") or "")
      return pid and (read_file(dir .. "/sentinel.log") or ""):find("+monitor master", 1, true) and pid
    end)
    if not up then
      local log = read_file(dir .. "/sentinel.log") or ""
      local pid = tonumber(read_file(dir .. "/sentinel.pid") or "")
      if pid then os.execute("kill " .. pid .. " 2>/dev/null") end
      error("cannot start redis-server --sentinel; its log says:\n" .. log)
    end
    return setmetatable({ host = host, port = port, dir = dir, pid = up }, Server)
  end

  function helpers.start_sentinels(opts)
    local own = opts and opts.own_addresses
    local function at(i) return own and { host = "127.0.0." .. (20 + i) } or nil end
    local master = helpers.start_redis(nil, at(1))
    local replica = helpers.start_redis({ "--replicaof", master.host, tostring(master.port) }, at(2))
    local g = setmetatable({ nodes = { master, replica }, sentinels = {}, addrs = {}, extra = {}, name = "mymaster" },
                           Group)
    for i = 1, 3 do
      local ok, s = pcall(start_sentinel, master, nil, own and at(2 + i).host)
      if not ok then
        g:stop()
        error(s)
      end
      g.sentinels[i] = s
      g.addrs[i] = s.host .. ":" .. s.port
    end
    local ready = helpers.eventually(30, function()
      for _, s in ipairs(g.sentinels) do
        local replicas = s:cli("SENTINEL", "replicas", "mymaster")
        local others = s:cli("SENTINEL", "sentinels", "mymaster")
        if not replicas:find(tostring(replica.port), 1, true) then return false end
        local n = 0
        for _ in others:gmatch("\nrunid\n") do n = n + 1 end
        if others:match("^runid\n") then n = n + 1 end
        if n < 2 then return false end
      end
      return true
    end)
    if not ready then
      g:stop()
      error("the sentinels never saw the replica and each other")
    end
    return g
  end

  --- The port of the master sentinel s names (get-master-addr-by-name), or
  -- nil; and what it answered.
  function Group:named_by(s)
    local out = s:cli("SENTINEL", "get-master-addr-by-name", self.name)
    return tonumber(out:match("\n(%d+)$")), out
  end

  --- The node the sentinels name as master now (a Server of group.nodes).
  function Group:master()
    local port, out = self:named_by(self.sentinels[1])
    for _, n in ipairs(self.nodes) do
      if n.port == port then return n end
    end
    error("the sentinels name no node of the group: " .. out)
  end

  -- The group's sentinels and the extra ones still running.
  local function watchers(self)
    local all = {}
    for _, s in ipairs(self.sentinels) do all[#all + 1] = s end
    for _, s in ipairs(self.extra) do
      if s.pid then all[#all + 1] = s end
    end
    return all
  end

  -- What a sentinel knows of the replica at port (SENTINEL replicas: one
  -- record of field and value lines each, from "name"), or nil.
  local function replica_record(s, name, port)
    local rec, found = nil, nil
    local key
    for line in (s:cli("SENTINEL", "replicas", name) .. "\n"):gmatch("([^\n]*)\n") do
      if key == nil then
        key = line
      else
        if key == "name" then rec = {} end
        if rec then rec[key] = line end
        if key == "port" and tonumber(line) == port then found = rec end
        key = nil
      end
    end
    return found
  end

  --- Whether the group has settled since its last failover: every sentinel
  -- (the extra ones too) names the same master, which says ROLE master, and
  -- the other node replicates from it (link up) and was last heard by every
  -- sentinel to say so (its INFO, which a sentinel asks a replica for every
  -- 10 s). A sentinel that last heard a demoted master say "master" takes it
  -- for a replica to convert: when a failover promotes that node before the
  -- new configuration reaches this sentinel (up to 2 s), the sentinel makes
  -- it a replica again (+convert-to-slave: it heard "master" for over 8 s),
  -- and the group is left with two replicas. true, or false and what is not
  -- settled yet.
  function Group:settled()
    local port
    for _, s in ipairs(watchers(self)) do
      local named, out = self:named_by(s)
      if not named or (port and named ~= port) then return false, "sentinel " .. s.port .. " names " .. out end
      port = named
    end
    local m = self:master()
    local replica = m == self.nodes[1] and self.nodes[2] or self.nodes[1]
    if not m:cli("ROLE"):match("^master\n") then return false, m.port .. " is named but says " .. m:cli("ROLE") end
    local info = replica:cli("INFO", "replication")
    if not (tonumber(info:match("master_port:(%d+)")) == m.port and info:find("master_link_status:up", 1, true)) then
      return false, replica.port .. " does not replicate " .. m.port .. " yet"
    end
    for _, s in ipairs(watchers(self)) do
      local rec = replica_record(s, self.name, replica.port)
      if not (rec and rec["role-reported"] == "slave" and tonumber(rec["master-port"]) == m.port
              and rec["master-link-status"] == "ok" and not rec.flags:find("down")
              and not rec.flags:find("disconnected")) then
        return false, "sentinel " .. s.port .. " has not heard " .. replica.port .. " say it replicates " .. m.port
      end
    end
    return true
  end

  --- Waits until the group settled (Group:settled); true, or false and what
  -- was not settled after 45 s. It looks every 0.5 s: a look runs redis-cli
  -- a dozen times, and settling takes up to a sentinel's next INFO (10 s).
  function Group:settle()
    local deadline = core.now() + 45 * helpers.slow
    local settled, why = self:settled()
    while not settled and core.now() < deadline do
      core.sleep(0.5)
      settled, why = self:settled()
    end
    return settled, why
  end

  --- Waits until the node that is not the master has its replication link up
  -- (after a failover it first resynchronizes) and every sentinel heard it
  -- say so (Group:settled); true, or false and what was not settled.
  function Group:caught_up()
    local m = self:master()
    local replica = m == self.nodes[1] and self.nodes[2] or self.nodes[1]
    local function up()
      return replica:cli("INFO", "replication"):find("master_link_status:up", 1, true) ~= nil
    end
    if not helpers.eventually(15, up) then
      -- The sentinels make a demoted master a replica once they look at it
      -- again; on a loaded machine that can take longer than a spec waits.
      -- This is the spec's own precondition, not what it tests: say it to
      -- the node as the sentinels would.
      replica:cli("REPLICAOF", m.host, tostring(m.port))
      if not helpers.eventually(30, up) then return false, replica.port .. " never replicated " .. m.port end
    end
    return self:settle()
  end

  --- Runs SENTINEL FAILOVER on the first sentinel once the group settled
  -- (Group:settled) and waits until every sentinel names the other node and
  -- that node says ROLE master; returns the old master and the new one.
  function Group:failover()
    local settled, why = self:settle()
    assert(settled, "the group never settled before a failover: " .. tostring(why))
    local old = self:master()
    local new = old == self.nodes[1] and self.nodes[2] or self.nodes[1]
    local said = helpers.eventually(30, function()
      local out = self.sentinels[1]:cli("SENTINEL", "FAILOVER", self.name)
      return out == "OK" and out
    end)
    assert(said, "SENTINEL FAILOVER never said OK")
    local switched = helpers.eventually(15, function()
      for _, s in ipairs(self.sentinels) do
        if self:named_by(s) ~= new.port then return false end
      end
      return new:cli("ROLE"):match("^master\n") ~= nil
    end)
    assert(switched, "the sentinels never named the new master")
    return old, new
  end

  --- Starts one more sentinel for the group's master now, with more
  -- configuration lines (e.g. { "requirepass pw" }); it votes in no failover
  -- of the group's (the others cannot talk to it when it wants AUTH) and is
  -- stopped with the group. Returns it (a Server).
  function Group:extra_sentinel(more)
    local s = start_sentinel(self:master(), more)
    self.extra[#self.extra + 1] = s
    return s
  end

  --- helpers.loops_across a SENTINEL FAILOVER of the group (fences and n
  -- passed on): also checks that
  -- more than 10 sections ran on the new master, and none on the demoted
  -- master once every sentinel named the new one (0.1 s for the
  -- announcement to arrive).
  function Group:loops_across_failover(spawn, fences, n)
    local settled, why = self:settle() -- before the loops start: they run a few seconds
    assert(settled, "the group never settled before a failover: " .. tostring(why))
    local old, new, named = self:master(), nil, nil
    local sections = helpers.loops_across(spawn, function()
      local _
      _, new = self:failover()
      named = core.now()
    end, fences, n)
    local on_new = 0
    for _, s in ipairs(sections) do if s.port == new.port then on_new = on_new + 1 end end
    assert(on_new > 10, "sections on the new master: " .. on_new)
    for _, s in ipairs(sections) do
      assert(not (s.port == old.port and s.enter > named + 0.1),
             string.format("a section on the demoted master %.3f s after the switch", s.enter - named))
    end
    return sections
  end

  -- Adds (how "-A") or deletes ("-D") the rules that drop every packet
  -- between the group's processes in apart and the others.
  -- (Undoing, "-D", goes on past a rule that is not there: a split that
  -- failed part way is undone whole.)
  local function cut(self, how, apart)
    local inside = {}
    for _, p in ipairs(apart) do inside[p] = true end
    for _, p in ipairs(apart) do
      for _, q in ipairs({ self.nodes[1], self.nodes[2], self.sentinels[1], self.sentinels[2], self.sentinels[3] }) do
        if not inside[q] then
          if how == "-D" then pcall(helpers.drop_between, how, p.host, q.host)
          else helpers.drop_between(how, p.host, q.host) end
        end
      end
    end
  end

  --- Cuts the group's processes in apart (Servers: nodes and sentinels)
  -- off the others, both ways, until group:heal(); clients on 127.0.0.1
  -- still reach every one. Needs a group started with own_addresses.
  function Group:split(apart)
    for _, p in ipairs(apart) do assert(p.host ~= "127.0.0.1", "split needs a group started with own_addresses") end
    self.apart = apart
    cut(self, "-A", apart)
  end

  --- Undoes group:split.
  function Group:heal()
    if self.apart then cut(self, "-D", self.apart) end
    self.apart = nil
  end

  local Quiet = {}
  Quiet.__index = Quiet

  --- A master the group's first sentinel knows as "quiet" (a redis-server of
  -- its own, watched with quorum 2, so never failed over), for a demotion no
  -- +switch-master announces: quiet:demote() makes a second server the master
  -- (the sentinel named it instead) and the first its replica, and closes the
  -- first's client connections, as a restart would. Fields: old, new
  -- (Servers), addr (the sentinel, for the client option). quiet:stop().
  function Group:quiet_master()
    local q = setmetatable({ old = helpers.start_redis(), new = helpers.start_redis(), sentinel = self.sentinels[1],
                             addr = self.addrs[1] }, Quiet)
    local said = q.sentinel:cli("SENTINEL", "MONITOR", "quiet", "127.0.0.1", q.old.port, 2)
    if said ~= "OK" then
      q:stop()
      error("SENTINEL MONITOR said " .. said)
    end
    return q
  end

  function Quiet:demote()
    for _, step in ipairs({ { self.sentinel, "SENTINEL", "REMOVE", "quiet" },
                            { self.old, "REPLICAOF", "127.0.0.1", self.new.port },
                            { self.sentinel, "SENTINEL", "MONITOR", "quiet", "127.0.0.1", self.new.port, 2 } }) do
      local said = step[1]:cli((table.unpack or unpack)(step, 2)) -- luacheck: ignore (unpack: LuaJIT)
      assert(said == "OK", step[2] .. " said " .. said)
    end
    self.old:cli("CLIENT", "KILL", "TYPE", "normal")
  end

  function Quiet:stop()
    self.sentinel:cli("SENTINEL", "REMOVE", "quiet")
    self.old:stop()
    self.new:stop()
  end

  --- Stops every process of the group, by PID.
  function Group:stop()
    for _, s in ipairs(self.extra or {}) do s:stop() end
    for _, s in ipairs(self.sentinels) do s:stop() end
    for _, n in ipairs(self.nodes) do n:stop() end
  end
end
