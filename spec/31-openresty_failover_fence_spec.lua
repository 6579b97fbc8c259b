-- SPDX-License-Identifier: MIT
-- Fences that never go backwards across a failover, under OpenResty (the
-- cosocket transport; spec/30 is the same in plain Lua): in a real nginx (2
-- workers), a replica that missed the master's last locks is promoted behind
-- the one address the workers use, behind Sentinel, and in a Redis Cluster;
-- every fence it hands out is above every fence the old master handed out.
-- The handler is spec/support/ngx_app.lua's /fences (a lock, a fresh key, a
-- semaphore's permit, a writer, a multi-key lock). Each topology and nginx
-- are started once. LuaJIT pass only (nginx loads that build).
local core = require "redislock.core"
local helpers = require "spec.helpers"
local http = require "spec.support.http"
local failover = require "spec.support.failover"

local signal, synced, cut_off, above = failover.signal, failover.synced, failover.cut_off, failover.above

describe("OpenResty across a failover", function()
  if not jit then
    pending("runs in the LuaJIT pass of make test (nginx loads the LuaJIT build)")
    return
  end

  local master, replica, dir, g, cl, nginx

  lazy_setup(function()
    master = helpers.start_redis()
    replica = helpers.start_redis({ "--replicaof", "127.0.0.1", tostring(master.port) })
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir " .. dir .. " && ln -s " .. master.sock .. " " .. dir .. "/redis.sock"))
    g = helpers.start_sentinels()
    -- Nodes on addresses of their own in the suite's network namespace, so
    -- that the old master can be cut off the cluster (see spec/30).
    cl = helpers.start_cluster({ own_addresses = helpers.netns, node_timeout = helpers.netns and 30000 or nil })
    local owner = cl:owner(core.lock_slot("{orders}:42"))
    local function server(name, vars)
      local lines = { "server {", "  listen 127.0.0.1:{{port}};", "  server_name " .. name .. ";" }
      for k, v in pairs(vars) do lines[#lines + 1] = string.format('  set $%s "%s";', k, v) end
      lines[#lines + 1] = "  location = /fences { content_by_lua_block { require('spec.support.ngx_app').fences() } }"
      lines[#lines + 1] = "  location = /master { content_by_lua_block { require('spec.support.ngx_app').master() } }"
      lines[#lines + 1] = "}"
      return table.concat(lines, "\n")
    end
    local seeds = table.concat(cl.seeds, ",")
    nginx = helpers.start_nginx({
      workers = 2,
      http = table.concat({
        "lua_socket_log_errors off;",
        server("one", { redis_url = "unix://" .. dir .. "/redis.sock", redis_timeout = "1" }),
        server("direct", { redis_url = "redis://127.0.0.1:" .. master.port, redis_timeout = "1" }),
        server("sentinel", { redis_sentinels = table.concat(g.addrs, ","), redis_master = g.name }),
        server("sentinel-old", { redis_url = "redis://127.0.0.1:" .. g:master().port, redis_timeout = "1" }),
        server("cluster", { redis_cluster = seeds }),
        server("cluster-old", { redis_url = "redis://" .. owner.host .. ":" .. owner.port, redis_timeout = "1" }),
      }, "\n"),
    })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
    for _, s in ipairs({ master, replica, g and g.nodes[1], g and g.nodes[2] }) do
      if s and s.pid then signal(s, "CONT") end
    end
    if cl then
      for _, n in ipairs(cl.nodes) do if n.pid then signal(n, "CONT") end end
      cl:stop()
    end
    if g then g:stop() end
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
  local function lost_rounds(host, key, fresh, seen, from, to)
    assert(fences(host, key, seen, 2))
    synced(from, to)
    cut_off(from, to)
    return assert(fences(host, key, fresh, 8))
  end

  it("behind the one address: the promoted replica's fences are above the old master's, also its later ones", function()
    local old = lost_rounds("one", "orders:42", "fresh", "seen", master, replica)
    signal(replica, "CONT")
    assert.are.equal("OK", replica:cli("REPLICAOF", "NO", "ONE"))
    master:cli("CLIENT", "KILL", "TYPE", "normal")
    assert(os.execute("ln -sfn " .. replica.sock .. " " .. dir .. "/redis.sock"))
    -- Each worker's pool held connections to the old master: a request on
    -- each worker (2 workers: four requests reach both, most likely).
    local first = eventually_fences("one", "orders:42", "fresh")
    above(first, old, "the promoted replica's first locks")
    local late = assert(fences("direct", "orders:42", "fresh", 3))
    above(late, old, "the old master's later locks")
    above(first, late, "the promoted replica's first locks against the old master's later ones")
    for _ = 1, 4 do
      above(assert(fences("one", "orders:42", "fresh")), late, "the promoted replica's next locks")
    end
  end)

  it("behind Sentinel: the new master's fences are above those of the master it replaced", function()
    local old_master = g:master()
    local other = old_master == g.nodes[1] and g.nodes[2] or g.nodes[1]
    local old = lost_rounds("sentinel", "orders:42", "fresh", "seen", old_master, other)
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
    -- client that still talks to it: below the new master's.
    signal(old_master, "CONT")
    local late = assert(fences("sentinel-old", "orders:42", "fresh"))
    above(first, late, "the new master's first locks against the old master's later ones")
    for _ = 1, 4 do
      above(assert(fences("sentinel", "orders:42", "fresh")), late, "the new master's next locks")
    end
  end)

  it("in a Redis Cluster: the promoted replica's fences are above its master's, also its later ones", function()
    local slot = core.lock_slot("{orders}:42")
    local old_master = cl:owner(slot)
    local other = cl:replica_of(old_master)
    local old = lost_rounds("cluster", "{orders}:42", "{orders}:fresh", "{orders}:seen", old_master, other)
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
    -- heard: it grants to a client that talks to it directly, below the
    -- new master's fences.
    -- (A lock a worker sent it while it was paused may be held there until
    -- its TTL: tried again meanwhile.)
    assert.matches("^master", old_master:cli("ROLE"))
    local late = eventually_fences("cluster-old", "{orders}:42", "{orders}:fresh")
    above(late, old, "the old master's later locks")
    above(first, late, "the new master's first locks against the old master's later ones")
    for _ = 1, 4 do
      above(assert(fences("cluster", "{orders}:42", "{orders}:fresh")), late, "the new master's next locks")
    end
  end)

  if not helpers.netns then
    pending("the cluster's old master's later locks: they need the suite's own network namespace (make test as root)")
  end
end)
