-- SPDX-License-Identifier: MIT
-- run.sh: long 100 (its seconds on a loaded 2-core machine: spec/run.sh starts it early; make check skips it)
-- Fences that never go backwards across a failover (csrc/scripts/README.md,
-- "Fences": a fence is the server's clock in ms since 2025 x 64, or one above the
-- slot's last), in plain Lua: a replica that missed the master's last locks
-- (SIGSTOP, then CLIENT KILL TYPE replica: what the master already sent
-- would otherwise wait in its socket) is promoted, and every fence it hands
-- out is above every fence the old master handed out before, also those of
-- the locks it never saw. The old master may still grant after the
-- promotion, to a client that still talks to it: fences order grants by
-- time whichever master granted them, so the promoted replica's locks
-- granted after those late ones are above them (its first ones, granted
-- before, may be below: by design). For the lock, a semaphore's permit, a
-- read-write lock's writer and each key of a multi-key lock. One topology
-- per describe block, started once. Then the same under OpenResty.
local redislock = require("redislock")
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")

local failover = require("spec.support.failover")

local signal, above, take_all = failover.signal, failover.above, failover.take_all

-- Two rounds the replica gets (seen: the fresh key's stand-in), then the
-- replica cut off and eight rounds it never gets: their highest fences.
local function lost_rounds(client, master, replica, keys, seen)
  take_all(client, 2, { lock = keys.lock, fresh = seen })
  failover.synced(master, replica)
  failover.cut_off(master, replica)
  return take_all(client, 8, keys)
end

-- Stops a topology (a Sentinel group, a cluster) once its nodes that a
-- test SIGSTOPped run again.
local function stop_resumed(topology)
  if not topology then return end
  for _, n in ipairs(topology.nodes) do if n.pid then signal(n, "CONT") end end
  topology:stop()
end

describe("a promoted replica behind the client's one address (REPLICAOF NO ONE)", function()
  local master, replica, dir

  lazy_setup(function()
    master, replica = helpers.start_with_replica()
    dir = helpers.tmpdir()
  end)
  lazy_teardown(function()
    if replica then signal(replica, "CONT") end
    if master then master:stop() end
    if replica then replica:stop() end
    if dir then os.execute("rm -rf " .. dir) end
  end)

  it("hands out fences above the old master's, also those it never saw, and above its later ones after them", function()
    -- The one address: a unix socket path that names the master, then the
    -- promoted replica (as a managed Redis re-points its name).
    local addr = dir .. "/redis.sock"
    assert(os.execute("ln -s " .. master.sock .. " " .. addr))
    local client = redislock.new({ path = addr, timeout = 2 })
    local direct = redislock.new({ port = master.port }) -- talks to the old master throughout
    local keys = { lock = "orders:42", fresh = "fresh" }
    take_all(client, 2, { lock = keys.lock, fresh = "seen" })
    failover.synced(master, replica)
    failover.cut_off(master, replica)
    local old = take_all(client, 8, keys)

    -- The failover: the replica comes back and is promoted, the old master's
    -- clients are cut off, and the address names the new master.
    signal(replica, "CONT")
    assert.are.equal("OK", replica:cli("REPLICAOF", "NO", "ONE"))
    master:cli("CLIENT", "KILL", "TYPE", "normal")
    assert(os.execute("ln -sfn " .. replica.sock .. " " .. addr))

    local first = take_all(client, 1, keys)
    above(first, old, "the promoted replica's first locks")
    -- The old master still grants, to a client that still talks to it.
    -- Those grants come after the promoted replica's first ones, and fences
    -- follow the clock whichever master grants: they may be above `first`
    -- (no comparison of the two), and the promoted replica's next locks,
    -- granted after them, are above them.
    local late = take_all(direct, 3, keys)
    above(late, old, "the old master's later locks")
    core.sleep(0.002) -- a millisecond apart at least: two masters' grants within one may tie
    above(take_all(client, 1, keys), late, "the promoted replica's next locks")
    -- Within one master they keep growing, lock after lock.
    local a = assert(client:acquire(keys.lock, 5))
    assert(a:release())
    local b = assert(client:acquire(keys.lock, 5))
    assert(b:release())
    assert.is_true(b.fence > a.fence, b.fence .. " > " .. a.fence)
    direct:close()
    client:close()
  end)
end)

describe("a failover behind Sentinel", function()
  local g

  lazy_setup(function() g = helpers.start_sentinels() end)
  lazy_teardown(function() stop_resumed(g) end)

  it("hands out fences above those of the master it replaced, and above its later ones after them", function()
    local old_master = g:master()
    local replica = old_master == g.nodes[1] and g.nodes[2] or g.nodes[1]
    local client = redislock.new({ sentinels = g.addrs, master = g.name, timeout = 1 })
    local keys = { lock = "orders:42", fresh = "fresh" }
    local old = lost_rounds(client, old_master, replica, keys, "seen")

    -- The master stops answering; the replica, back, is promoted by the
    -- sentinels. Nothing is sent until the client heard of it: a lock sent
    -- to the stopped master would wait in its socket and be taken when it
    -- resumes.
    signal(old_master, "STOP")
    signal(replica, "CONT")
    assert(helpers.eventually(30, function() return g:master() == replica end), "the sentinels never switched")
    assert(helpers.eventually(10, function()
      return client._transport._watch:count() ~= client._transport._seen
    end), "the client never heard of the switch")
    local first = failover.first_round(client, keys)
    above(first, old, "the new master's first locks")

    -- The old master comes back and still grants until the sentinels demote
    -- it, to a client that talks to it directly; the new master's locks
    -- granted after those are above them (not its first ones, granted
    -- before: fences order grants by time, whichever master grants, at the
    -- clock's resolution: two masters' grants within one millisecond may tie).
    signal(old_master, "CONT")
    local direct = redislock.new({ port = old_master.port, timeout = 1 })
    local late = take_all(direct, 1, keys)
    core.sleep(0.002)
    above(take_all(client, 1, keys), late, "the new master's next locks")
    direct:close()
    client:close()
  end)
end)

describe("a failover in a Redis Cluster", function()
  local cl

  -- In the suite's own network namespace each node has an address of its
  -- own, so that the old master can be cut off the cluster while clients
  -- still reach it; a long node timeout keeps it serving meanwhile.
  lazy_setup(function()
    cl = helpers.start_cluster({ own_addresses = helpers.netns, node_timeout = helpers.netns and 30000 or nil })
  end)
  lazy_teardown(function() stop_resumed(cl) end)

  it("hands out fences above those of the master its replica replaced", function()
    local client = redislock.new({ cluster = cl.seeds, timeout = 1 })
    -- Every key under one hash tag: one slot, one master (a multi-key lock
    -- across masters is taken key by key).
    local keys = { lock = "{orders}:42", fresh = "{orders}:fresh" }
    local slot = core.lock_slot("{orders}:42")
    local old_master = cl:owner(slot)
    local replica = cl:replica_of(old_master)
    local old = lost_rounds(client, old_master, replica, keys, "{orders}:seen")

    -- The old master pauses, cut off the other nodes (when it can be); its
    -- replica takes over without it.
    signal(old_master, "STOP")
    if helpers.netns then cl:isolate(old_master) end
    signal(replica, "CONT")
    assert(helpers.eventually(10, function()
      return replica:cli("CLUSTER", "FAILOVER", "TAKEOVER") == "OK"
    end), "CLUSTER FAILOVER TAKEOVER refused")
    assert(helpers.eventually(15, function() return replica:cli("ROLE"):match("^master") end), "no takeover")
    local first = failover.first_round(client, keys)
    above(first, old, "the new master's first locks")
    signal(old_master, "CONT")
    if helpers.netns then
      -- Back, and still the slot's master by all it heard: it grants to a
      -- client that talks to it directly; the new master's locks granted
      -- after those are above them (its first ones, granted before, need
      -- not be: fences order grants by time).
      assert.matches("^master", old_master:cli("ROLE"))
      local direct = redislock.new({ host = old_master.host, port = old_master.port, timeout = 1 })
      local late = take_all(direct, 1, keys)
      above(late, old, "the old master's later locks")
      core.sleep(0.002) -- a millisecond apart at least: two masters' grants within one may tie
      above(take_all(client, 1, keys), late, "the new master's next locks")
      direct:close()
    end
    client:close()
  end)

  if not helpers.netns then
    pending("the old master's later locks: they need the suite's own network namespace (make test as root)")
  end
end)

-- The same under OpenResty (the cosocket transport): in a real nginx (2
-- workers), a replica that missed the master's last locks is promoted behind
-- the one address the workers use, behind Sentinel, and in a Redis Cluster;
-- every fence it hands out is above every fence the old master handed out
-- before, and those it hands out after the old master's late grants are
-- above them.
-- The handler is spec/support/ngx_app.lua's /fences (a lock, a fresh key, a
-- semaphore's permit, a writer, a multi-key lock). Each topology and nginx
-- are started once more for it: each test above consumed its own (a replica
-- promoted). LuaJIT pass only (nginx loads that build).
describe("OpenResty across a failover", function()
  if helpers.no_nginx(pending) then return end

  local master, replica, dir, g, cl, nginx

  lazy_setup(function()
    master, replica = helpers.start_with_replica()
    dir = helpers.tmpdir()
    assert(os.execute("ln -s " .. master.sock .. " " .. dir .. "/redis.sock"))
    g = helpers.start_sentinels()
    -- Nodes on addresses of their own in the suite's network namespace, so
    -- that the old master can be cut off the cluster (see spec/30).
    cl = helpers.start_cluster({ own_addresses = helpers.netns, node_timeout = helpers.netns and 30000 or nil })
    local owner = cl:owner(core.lock_slot("{orders}:42"))
    local function server(name, vars)
      local lines = { name = name }
      for k, v in pairs(vars) do lines[#lines + 1] = string.format('set $%s "%s";', k, v) end
      lines[#lines + 1] = helpers.location("/fences", "fences")
      lines[#lines + 1] = helpers.location("/master", "master")
      return lines
    end
    local seeds = table.concat(cl.seeds, ",")
    nginx = helpers.start_nginx({
      workers = 2,
      http = "lua_socket_log_errors off;",
      servers = {
        server("one", { redis_url = "unix://" .. dir .. "/redis.sock", redis_timeout = "1" }),
        server("direct", { redis_url = "redis://127.0.0.1:" .. master.port, redis_timeout = "1" }),
        server("sentinel", { redis_sentinels = table.concat(g.addrs, ","), redis_master = g.name }),
        server("sentinel-old", { redis_url = "redis://127.0.0.1:" .. g:master().port, redis_timeout = "1" }),
        server("cluster", { redis_cluster = seeds }),
        server("cluster-old", { redis_url = "redis://" .. owner.host .. ":" .. owner.port, redis_timeout = "1" }),
      },
    })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
    for _, s in ipairs({ master, replica }) do
      if s.pid then signal(s, "CONT") end
    end
    stop_resumed(cl)
    stop_resumed(g)
    if master then master:stop() end
    if replica then replica:stop() end
    if dir then os.execute("rm -rf " .. dir) end
  end)

  -- The fences of rounds requests to /fences on the server named host (the
  -- highest of each), or nil and the last failure.
  local function fences(host, key, fresh, rounds)
    local top = {}
    for _ = 1, rounds or 1 do
      local status, body = http.request(nginx.port, "GET", "/fences?key=" .. key .. "&fresh=" .. fresh,
                                        { headers = { Host = host } })
      if status ~= 200 then return nil, status .. " " .. body end
      for name, f in pairs(failover.parse(body)) do
        if not top[name] or f > top[name] then top[name] = f end
      end
    end
    return top
  end

  -- fences(), retried for up to 20 s (while a failover settles).
  local function eventually_fences(host, key, fresh)
    local got, last
    helpers.eventually(20, function()
      got, last = fences(host, key, fresh)
      return got
    end)
    return assert(got, "no fences from " .. host .. ": " .. tostring(last) .. "\n" .. nginx:error_log())
  end

  -- Two requests' rounds the replica gets, then the replica cut off and
  -- eight it never gets (on the server named host): their highest fences.
  local function lost_ngx_rounds(host, key, fresh, seen, from, to)
    assert(fences(host, key, seen, 2))
    failover.synced(from, to)
    failover.cut_off(from, to)
    return assert(fences(host, key, fresh, 8))
  end

  -- Four requests' fences from host (names from key and fresh), each above
  -- every fence of late (the old master's late grants): a millisecond after
  -- them at least, as two masters' grants within one may tie.
  local function next_above(host, key, fresh, late, what)
    core.sleep(0.002)
    for _ = 1, 4 do
      above(assert(fences(host, key, fresh)), late, what)
    end
  end

  it("behind the one address: the promoted replica's fences are above the old master's, then its late ones", function()
    local old = lost_ngx_rounds("one", "orders:42", "fresh", "seen", master, replica)
    signal(replica, "CONT")
    assert.are.equal("OK", replica:cli("REPLICAOF", "NO", "ONE"))
    master:cli("CLIENT", "KILL", "TYPE", "normal")
    assert(os.execute("ln -sfn " .. replica.sock .. " " .. dir .. "/redis.sock"))
    -- Each worker's pool held connections to the old master: a request on
    -- each worker (2 workers: four requests reach both, most likely).
    local first = eventually_fences("one", "orders:42", "fresh")
    above(first, old, "the promoted replica's first locks")
    -- The old master's late grants, then the promoted replica's, above
    -- them (its first ones were granted before them: not compared).
    local late = assert(fences("direct", "orders:42", "fresh", 3))
    above(late, old, "the old master's later locks")
    next_above("one", "orders:42", "fresh", late, "the promoted replica's next locks")
  end)

  it("behind Sentinel: the new master's fences are above those of the master it replaced", function()
    local old_master = g:master()
    local other = old_master == g.nodes[1] and g.nodes[2] or g.nodes[1]
    local old = lost_ngx_rounds("sentinel", "orders:42", "fresh", "seen", old_master, other)
    signal(old_master, "STOP")
    signal(other, "CONT")
    assert(helpers.eventually(30, function() return g:master() == other end), "the sentinels never switched")
    -- Until both workers heard the switch, a request may go to the paused
    -- master and time out, its commands left in that master's socket: only
    -- PINGs (/master), so that no lock waits there for the old master to resume.
    local on = {}
    assert(helpers.eventually(20, function()
      local status, body = http.request(nginx.port, "GET", "/master", { headers = { Host = "sentinel" } })
      local port, pid = body:match("^(%d+) (%d+)")
      if status == 200 then on[pid] = tonumber(port) == other.port end
      local n = 0
      for _, yes in pairs(on) do n = n + (yes and 1 or 0) end
      return n == 2
    end), "the workers never followed the switch")
    local first = eventually_fences("sentinel", "orders:42", "fresh")
    above(first, old, "the new master's first locks")
    -- The old master comes back and grants, until it is demoted, to a
    -- client that still talks to it; the new master's grants after those
    -- are above them (its first ones, before them, are not compared).
    signal(old_master, "CONT")
    local late = assert(fences("sentinel-old", "orders:42", "fresh"))
    next_above("sentinel", "orders:42", "fresh", late, "the new master's next locks")
  end)

  it("in a Redis Cluster: the promoted replica's fences are above its master's, then its late ones", function()
    local slot = core.lock_slot("{orders}:42")
    local old_master = cl:owner(slot)
    local other = cl:replica_of(old_master)
    local old = lost_ngx_rounds("cluster", "{orders}:42", "{orders}:fresh", "{orders}:seen", old_master, other)
    signal(old_master, "STOP")
    if helpers.netns then cl:isolate(old_master) end
    signal(other, "CONT")
    assert(helpers.eventually(10, function() return other:cli("CLUSTER", "FAILOVER", "TAKEOVER") == "OK" end),
           "CLUSTER FAILOVER TAKEOVER refused")
    assert(helpers.eventually(15, function() return other:cli("ROLE"):match("^master") end), "no takeover")
    local first = eventually_fences("cluster", "{orders}:42", "{orders}:fresh")
    above(first, old, "the new master's first locks")
    signal(old_master, "CONT")
    if not helpers.netns then return end
    -- Back, cut off the cluster, and still the slot's master by all it
    -- heard: it grants to a client that talks to it directly; the new
    -- master's grants after those are above them (its first ones, before
    -- them, are not compared: fences order grants by time).
    -- (A lock a worker sent it while it was paused may be held there until
    -- its TTL: tried again meanwhile.)
    assert.matches("^master", old_master:cli("ROLE"))
    local late = eventually_fences("cluster-old", "{orders}:42", "{orders}:fresh")
    above(late, old, "the old master's later locks")
    next_above("cluster", "{orders}:42", "{orders}:fresh", late, "the new master's next locks")
  end)

  if not helpers.netns then
    pending("the cluster's old master's later locks: they need the suite's own network namespace (make test as root)")
  end
end)
