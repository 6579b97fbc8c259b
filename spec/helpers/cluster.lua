-- SPDX-License-Identifier: MIT
-- spec/helpers.lua's Redis Clusters on loopback (helpers.start_cluster):
-- slots, owners, moves, failovers, and nodes cut apart in the suite's
-- network namespace.
local core = require("redislock.core")

return function(helpers)
  local run = helpers.run
  local sh_quote = helpers.sh_quote

  local Cluster = {}
  Cluster.__index = Cluster

  --- Starts a Redis Cluster on loopback: 3 masters and 3 replicas
  -- (cluster-node-timeout 2000), each by PID under a folder of its own (ports
  -- at most 55535: the cluster bus is port + 10000), made one cluster by
  -- `redis-cli --cluster create --cluster-replicas 1`. Returns once every node
  -- says cluster_state:ok and all agree on the slots. cluster.nodes = { Server
  -- ... }, cluster.seeds = { "127.0.0.1:<port>", ... } (for the client
  -- option). opts.masters (3) and opts.replicas (1 per master); opts.tls and
  -- opts.password: the nodes take clients and talk to each other over TLS
  -- only (helpers.tls_certs), and want that password (nodes keep a plaintext
  -- unix socket for the checks, where CLUSTER SLOTS gives port 0).
  -- opts.node_timeout: cluster-node-timeout (ms); opts.full_coverage = false:
  -- the slots of the other masters are served while one master is down;
  -- opts.extra: more arguments for every node (e.g. its append-only file). opts.own_addresses: node i
  -- listens on 127.0.0.(10 + i), so that cluster:isolate can cut it off the
  -- others (needs helpers.netns). Raises when it cannot start.
  function helpers.start_cluster(opts)
    opts = opts or {}
    local masters, replicas = opts.masters or 3, opts.replicas or 1
    local c = setmetatable({ nodes = {}, seeds = {} }, Cluster)
    local ok, err = pcall(function()
      local extra = { "--cluster-enabled", "yes", "--cluster-node-timeout", tostring(opts.node_timeout or 2000),
                      "--cluster-require-full-coverage", opts.full_coverage == false and "no" or "yes" }
      for _, a in ipairs(opts.extra or {}) do extra[#extra + 1] = a end
      local cli = "redis-cli"
      if opts.tls then
        local certs = helpers.tls_certs()
        -- The server certificate is for serverAuth only: nodes connect to
        -- each other with the client one.
        for _, a in ipairs({ "--tls-cluster", "yes", "--tls-replication", "yes", "--tls-client-cert-file",
                             certs .. "/client.crt", "--tls-client-key-file", certs .. "/client.key" }) do
          extra[#extra + 1] = a
        end
        cli = cli .. " --tls --cacert " .. sh_quote(certs .. "/ca.crt")
              .. " --cert " .. sh_quote(certs .. "/client.crt") .. " --key " .. sh_quote(certs .. "/client.key")
      end
      if opts.password then
        for _, a in ipairs({ "--requirepass", opts.password, "--masterauth", opts.password }) do
          extra[#extra + 1] = a
        end
        cli = cli .. " --no-auth-warning -a " .. sh_quote(opts.password)
      end
      for i = 1, masters * (1 + replicas) do
        c.nodes[i] = helpers.start_redis(extra, { cluster = true, tls = opts.tls and "yes" or nil,
                                                  host = opts.own_addresses and "127.0.0." .. (10 + i) or nil })
        c.nodes[i].password = opts.password
        c.seeds[i] = c.nodes[i].host .. ":" .. c.nodes[i].port
      end
      local out, created = run("timeout 60 " .. cli .. " --cluster create " .. table.concat(c.seeds, " ")
                               .. " --cluster-replicas " .. replicas .. " --cluster-yes 2>&1")
      assert(created, "redis-cli --cluster create failed:\n" .. out)
      assert(c:settled(30), "the cluster never settled")
    end)
    if not ok then
      c:stop()
      error(err)
    end
    return c
  end

  --- Waits (up to seconds) until every running node says cluster_state:ok and
  -- all of them give the same masters for the same slots; true, or false.
  function Cluster:settled(seconds)
    return helpers.eventually(seconds, function()
      local seen
      for _, n in ipairs(self.nodes) do
        if n.pid then
          if not n:cli("CLUSTER", "INFO"):find("cluster_state:ok", 1, true) then return false end
          local _, slots = self:ranges(n)
          if seen and seen ~= slots then return false end
          seen = slots
        end
      end
      return true
    end)
  end

  -- The slot ranges node n tells (CLUSTER SLOTS), as { { first, last, node
  -- id of the master }, ... } sorted, and the same as one string.
  function Cluster.ranges(_, n)
    local raw = n:raw()
    local reply = assert(raw:command("CLUSTER", "SLOTS"))
    raw:close()
    local ranges, text = {}, {}
    for _, r in ipairs(reply) do ranges[#ranges + 1] = { r[1], r[2], r[3][3] } end
    table.sort(ranges, function(a, b) return a[1] < b[1] end)
    for i, r in ipairs(ranges) do text[i] = table.concat(r, "-") end
    return ranges, table.concat(text, ",")
  end

  --- The node (a Server) that serves slot as master now, by what node n (the
  -- first running node, if not given) says.
  function Cluster:owner(slot, n)
    if not n then
      for _, m in ipairs(self.nodes) do
        if m.pid then
          n = m
          break
        end
      end
    end
    for _, r in ipairs((self:ranges(n))) do
      if slot >= r[1] and slot <= r[2] then
        for _, m in ipairs(self.nodes) do
          if m.pid and self:id(m) == r[3] then return m end
        end
      end
    end
    error("no node serves slot " .. slot)
  end

  --- The value of the lock on key ("lock:{key}") at its slot's owner now
  -- (cl:owner), and that owner.
  function Cluster:lock_at_owner(key)
    local owner = self:owner(core.lock_slot(key))
    return owner:cli("GET", "lock:{" .. key .. "}"), owner
  end

  --- Takes and releases, over client c, a lock on each of "<prefix>1" to
  -- "<prefix><n>", raising unless its slot's owner held the lock's token;
  -- returns how many nodes held one.
  function Cluster:spread(c, prefix, n)
    local owners, count = {}, 0
    for i = 1, n do
      local key = prefix .. i
      local lock = assert(c:acquire(key, 5))
      local value, owner = self:lock_at_owner(key)
      assert(value == lock.token, key .. " is not held at its slot's owner")
      if not owners[owner] then owners[owner], count = true, count + 1 end
      assert(lock:release())
    end
    return count
  end

  --- Starts moving slot from one master to another (Servers): SETSLOT
  -- IMPORTING on the target, MIGRATING on the source. The keys stay on the
  -- source until move_keys.
  function Cluster:begin_move(slot, from, to)
    assert(to:cli("CLUSTER", "SETSLOT", slot, "IMPORTING", self:id(from)) == "OK")
    assert(from:cli("CLUSTER", "SETSLOT", slot, "MIGRATING", self:id(to)) == "OK")
  end

  --- MIGRATEs every key of slot from the source to the target.
  function Cluster.move_keys(_, slot, from, to)
    while true do
      local keys = {}
      for k in from:cli("CLUSTER", "GETKEYSINSLOT", slot, 100):gmatch("[^\n]+") do keys[#keys + 1] = k end
      if #keys == 0 then return end
      local argv = { "MIGRATE", to.host, to.port, "", 0, 5000 }
      if from.password then
        argv[#argv + 1] = "AUTH"
        argv[#argv + 1] = from.password
      end
      argv[#argv + 1] = "KEYS"
      for _, k in ipairs(keys) do argv[#argv + 1] = k end
      local said = from:cli((table.unpack or unpack)(argv)) -- luacheck: ignore (unpack: LuaJIT)
      assert(said == "OK", "MIGRATE said " .. said)
    end
  end

  --- Ends the move: SETSLOT NODE on the target, the source and the other
  -- masters, as redis-cli --cluster reshard does.
  function Cluster:end_move(slot, from, to)
    local id = self:id(to)
    assert(to:cli("CLUSTER", "SETSLOT", slot, "NODE", id) == "OK")
    assert(from:cli("CLUSTER", "SETSLOT", slot, "NODE", id) == "OK")
    for _, n in ipairs(self.nodes) do
      if n.pid and n ~= to and n ~= from and n:cli("ROLE"):match("^master") then
        n:cli("CLUSTER", "SETSLOT", slot, "NODE", id)
      end
    end
  end

  --- Moves slot, keys and all, from its owner to another master; returns the
  -- old owner and the new one.
  function Cluster:move(slot, to)
    local from = self:owner(slot)
    to = to or self:other_master(from)
    self:begin_move(slot, from, to)
    self:move_keys(slot, from, to)
    self:end_move(slot, from, to)
    return from, to
  end

  --- Moves slot from one master to another (Servers) in steps 0.3 s
  -- apart: half moved (the keys still on the source), the keys on the target
  -- (the slot still the source's), moved.
  function Cluster:move_in_steps(slot, from, to)
    self:begin_move(slot, from, to)
    core.sleep(0.3)
    self:move_keys(slot, from, to)
    core.sleep(0.3)
    self:end_move(slot, from, to)
  end

  --- The slot of key's lock, the master that owns it, and another master
  -- (where a move would take it).
  function Cluster:where(key)
    local slot = core.lock_slot(key)
    local from = self:owner(slot)
    return slot, from, self:other_master(from)
  end

  --- A master other than n (a Server).
  function Cluster:other_master(n)
    for _, m in ipairs(self.nodes) do
      if m.pid and m ~= n and m:cli("ROLE"):match("^master") then return m end
    end
    error("no other master")
  end

  --- How many MOVED (and ASK) errors the running nodes have answered so far
  -- (INFO errorstats).
  function Cluster:redirects()
    local moved, ask = 0, 0
    for _, n in ipairs(self.nodes) do
      if n.pid then
        local info = n:cli("INFO", "errorstats")
        moved = moved + tonumber(info:match("errorstat_MOVED:count=(%d+)") or "0")
        ask = ask + tonumber(info:match("errorstat_ASK:count=(%d+)") or "0")
      end
    end
    return moved, ask
  end

  --- The replica (a Server) of master n.
  function Cluster:replica_of(n)
    local id = self:id(n)
    for _, m in ipairs(self.nodes) do
      if m.pid and m ~= n and m:cli("CLUSTER", "MYID") ~= id then
        local role = m:cli("ROLE")
        if role:match("^slave") and tonumber(role:match("\n(%d+)\n")) == n.port then return m end
      end
    end
    error("master " .. n.port .. " has no replica")
  end

  --- The node id of a node (CLUSTER MYID), asked once.
  function Cluster.id(_, n)
    n.node_id = n.node_id or n:cli("CLUSTER", "MYID")
    return n.node_id
  end

  -- Adds (how "-A") or deletes ("-D") the rules that drop every packet
  -- between node n and the other nodes (own_addresses); clients on 127.0.0.1
  -- still reach it.
  local function cut(self, how, n)
    for _, m in ipairs(self.nodes) do
      if m ~= n then helpers.drop_between(how, n.host, m.host) end
    end
  end

  --- Cuts node n (a Server) off the other nodes: no bus message, no
  -- replication either way, until cluster:heal(n). Its clients still reach
  -- it. Needs opts.own_addresses (and so helpers.netns).
  function Cluster:isolate(n)
    assert(n.host ~= "127.0.0.1", "isolate needs a cluster started with own_addresses")
    cut(self, "-A", n)
    self.isolated = self.isolated or {}
    self.isolated[n] = true
  end

  --- Undoes isolate(n).
  function Cluster:heal(n)
    if not (self.isolated and self.isolated[n]) then return end
    cut(self, "-D", n)
    self.isolated[n] = nil
  end

  --- Stops every node, by PID (healing what was isolated first).
  function Cluster:stop()
    for n in pairs(self.isolated or {}) do self:heal(n) end
    for _, n in ipairs(self.nodes) do n:stop() end
  end
end
