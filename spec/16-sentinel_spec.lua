-- SPDX-License-Identifier: MIT
-- run.sh: long 160 (its seconds on a loaded 2-core machine: spec/run.sh starts it early; make check skips it)
-- Redis behind Sentinel: a real group on loopback (a master, a replica, three
-- sentinels; spec/helpers.lua), started once for this file. Locks go to the
-- master the sentinels name; a failover (SENTINEL FAILOVER) moves the client,
-- its waiters and its renewals to the new master, and no lock is taken on the
-- demoted master once the sentinels named the new one. In plain Lua, and under
-- OpenResty in a real nginx in front of the same group.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")
local redislock = require("redislock")

describe("Sentinel", function()
  local g

  lazy_setup(function() g = helpers.start_sentinels() end)
  lazy_teardown(function() if g then g:stop() end end)

  local function client(extra)
    local o = { sentinels = g.addrs, master = "mymaster" }
    for k, v in pairs(extra or {}) do o[k] = v end
    return redislock.new(o)
  end

  it("takes locks on the master the sentinels name", function()
    local c = client()
    local lock = assert(c:acquire("s:1", 5))
    local m = g:master()
    assert.are.equal(lock.token, m:cli("GET", "lock:{s:1}"))
    assert.is_true(lock:release())
    assert.are.equal("0", m:cli("EXISTS", "lock:{s:1}"))
    assert.matches('master "mymaster" via 3 sentinels', tostring(c))
    c:close()
  end)

  it("asks the sentinels again before it reconnects (the server closed an idle connection)", function()
    -- Resolutions so far, each of which ends with ROLE on the master (a
    -- sentinel keeps no command statistics).
    local function asked()
      return tonumber(g:master():cli("INFO", "commandstats"):match("cmdstat_role:calls=(%d+)") or "0")
    end
    local c = client()
    assert(assert(c:acquire("s:again", 5)):release())
    -- The watch subscribes after the first resolution, and a subscription
    -- made counts as news (a switch before it may have gone unheard): one
    -- more resolution, then quiet.
    core.sleep(0.3 * helpers.slow)
    assert(assert(c:acquire("s:again", 5)):release())
    local before = asked()
    assert(assert(c:acquire("s:again", 5)):release())
    assert.are.equal(before, asked()) -- a connection in use: nobody asked
    local m = g:master()
    assert.is_true(tonumber(m:cli("CLIENT", "KILL", "TYPE", "normal")) >= 1)
    assert(assert(c:acquire("s:again", 5)):release())
    assert.are.equal(before + 1, asked())
    c:close()
  end)

  it("takes no lock on a node demoted without a word from the sentinels (ROLE before it reconnects)", function()
    local q = g:quiet_master()
    finally(function() q:stop() end)
    local c = redislock.new({ sentinels = { q.addr }, master = "quiet" })
    assert(assert(c:acquire("s:quiet", 5)):release())
    q:demote()
    local lock = assert(c:acquire("s:quiet", 5))
    assert.are.equal(lock.token, q.new:cli("GET", "lock:{s:quiet}"))
    assert.is_true(lock:release())
    c:close()
  end)

  it("moves the sentinel that answered to the front", function()
    local down = "127.0.0.1:" .. helpers.free_port()
    local c = redislock.new({ sentinels = { down, g.addrs[2] }, master = "mymaster" })
    assert(assert(c:acquire("s:front", 5)):release())
    assert.are.equal(g.sentinels[2].port, c._transport.sentinels[1].port)
    c:close()
  end)

  it("authenticates to sentinels that want it (sentinel_username, sentinel_password)", function()
    local s = g:extra_sentinel({ "requirepass s3cret" })
    finally(function() s:stop() end) -- done with: the group's failovers need not wait for it (Group:settled)
    local addr = { "127.0.0.1:" .. s.port }
    local c = redislock.new({ sentinels = addr, master = "mymaster", sentinel_password = "s3cret" })
    assert(assert(c:acquire("s:auth", 5)):release())
    c:close()
    c = redislock.new({ sentinels = addr, master = "mymaster", sentinel_username = "default",
                        sentinel_password = "s3cret" })
    assert(assert(c:acquire("s:auth", 5)):release())
    c:close()
    c = redislock.new({ sentinels = addr, master = "mymaster" })
    helpers.acquire_fails(c, "s:auth", '^redis: no sentinel would say where master "mymaster" is %(redis: NOAUTH')
    c:close()
    c = redislock.new({ sentinels = addr, master = "mymaster", sentinel_password = "wrong" })
    helpers.acquire_fails(c, "s:auth", "redis: AUTH refused by 127.0.0.1:" .. s.port, true)
    c:close()
  end)

  it("talks TLS to sentinels that listen on TLS (sentinel_tls)", function()
    local certs, port = helpers.tls_certs(), helpers.free_port()
    local s = g:extra_sentinel({ "port 0", "tls-port " .. port, "tls-cert-file " .. certs .. "/server.crt",
                                 "tls-key-file " .. certs .. "/server.key", "tls-ca-cert-file " .. certs .. "/ca.crt",
                                 "tls-auth-clients yes" })
    finally(function() s:stop() end)
    local tls = { ca = certs .. "/ca.crt", cert = certs .. "/client.crt", key = certs .. "/client.key" }
    local c = redislock.new({ sentinels = { "127.0.0.1:" .. port }, master = "mymaster", sentinel_tls = tls })
    assert(assert(c:acquire("s:tls", 5)):release())
    c:close()
    c = redislock.new({ sentinels = { "127.0.0.1:" .. port }, master = "mymaster" }) -- plaintext to a TLS port
    helpers.acquire_fails(c, "s:tls", "^connection: no sentinel reachable")
    c:close()
  end)

  it("names the master no sentinel knows", function()
    local c = client({ master = "nope" })
    helpers.acquire_fails(c, "s:2", '^redis: no sentinel knows master "nope"')
    c:close()
  end)

  it("tries again while its wait lasts when no sentinel knows the master, then says so", function()
    -- Sentinels being reconfigured (a failover undone, as make torture
    -- does) name no master for a moment: a waiting acquire rides it out.
    local c = client({ master = "nope" })
    local t0 = core.now()
    local lock, err = c:acquire("s:2", 5, { wait = 0.5 })
    local took = core.now() - t0
    assert.is_nil(lock)
    assert.matches('^redis: no sentinel knows master "nope"', err)
    assert.is_true(took >= 0.45, "answered after " .. took .. " s")
    c:close()
  end)

  it("says so when no sentinel can be reached", function()
    local c = redislock.new({ sentinels = { "127.0.0.1:" .. helpers.free_port(), "127.0.0.1:" .. helpers.free_port() },
                              master = "mymaster", connect_timeout = 0.5 })
    helpers.acquire_fails(c, "s:3", '^connection: no sentinel reachable for master "mymaster" %(')
    c:close()
  end)

  it("refuses a node that the sentinels name but that is not a master (ROLE)", function()
    -- One sentinel told to watch the replica as if it were a master: it
    -- names the replica's address, which ROLE shows to be a replica.
    local replica = g:master() == g.nodes[1] and g.nodes[2] or g.nodes[1]
    local s = g.sentinels[1]
    assert.are.equal("OK", s:cli("SENTINEL", "MONITOR", "stale", "127.0.0.1", replica.port, 2))
    finally(function() s:cli("SENTINEL", "REMOVE", "stale") end)
    local c = redislock.new({ sentinels = { g.addrs[1] }, master = "stale" })
    helpers.acquire_fails(c, "s:4", '^redis: READONLY 127%.0%.0%.1:%d+, named master "stale" by the sentinels, '
                          .. 'says ROLE slave, not master %(asked 5 times%)')
    -- A failover may leave the sentinels naming a replica for a while: with
    -- wait time left, the acquire asks them again until it runs out (make
    -- torture saw it give up with 1.4 s of 2.4 left).
    local began = core.now()
    local lock, err = c:acquire("s:4", 5, { wait = 2 })
    assert.is_nil(lock)
    assert.is_true(core.now() - began >= 1.9, "gave up after " .. (core.now() - began) .. " s")
    assert.matches("^redis: READONLY ", err)
    c:close()
  end)

  it("checks its options", function()
    local refused = helpers.new_fails
    refused({ sentinels = { "127.0.0.1:1" } }, "options 'sentinels' and 'master' go together")
    refused({ master = "m" }, "options 'sentinels' and 'master' go together")
    refused({ sentinels = {}, master = "m" }, "option 'sentinels' must be a non-empty list")
    refused({ sentinels = { "a:b:c" }, master = "m" }, "option 'sentinels' item 1 must be \"host:port\"")
    refused({ sentinels = { "h:70000" }, master = "m" }, "item 1 has a port outside 1..65535")
    refused({ sentinels = { 7 }, master = "m" }, "item 1 must be \"host:port\" or { host =, port = }")
    refused({ sentinels = { "h:1" }, master = "m", host = "h" }, "option 'host' contradicts 'sentinels'")
    refused({ sentinels = { "h:1" }, master = "m", sentinel_username = "u" },
            "option 'sentinel_username' needs a 'sentinel_password'")
    refused({ sentinel_password = "p" }, "need 'sentinels'")
  end)

  it("follows a failover at once: the loops go on on the new master, no overlaps, none on the demoted one", function()
    -- Timing is the point here: not under valgrind (REDISLOCK_SLOW), where
    -- the other cases still run the watch thread.
    if helpers.slow > 1 then return pending("timing-bound: not under REDISLOCK_SLOW") end
    g:loops_across_failover(function(start_at)
      return helpers.spawn(helpers.spec_dir .. "workers/loop.lua", table.concat(g.addrs, ",") .. ":mymaster",
                           "failover", 6, start_at)
    end)
  end)

  it("keeps one leader at a time across a failover among five processes, terms growing", function()
    if helpers.slow > 1 then return pending("timing-bound: not under REDISLOCK_SLOW") end
    -- The replica in sync first: a failover back to a master the sentinels
    -- have not demoted yet is a failover undone (README: limits), whose
    -- fences may go backwards.
    assert.is_true(g:caught_up(), "the replica never caught up")
    g:loops_across_failover(function(start_at)
      return helpers.spawn(helpers.spec_dir .. "workers/loop.lua", table.concat(g.addrs, ",") .. ":mymaster",
                           "failover", 6, start_at, "elect")
    end, true, 5)
  end)

  it("lets a waiter blocked on the demoted master take the lock on the new one", function()
    local before = g:master()
    assert.is_true(g:caught_up(), "the replica never caught up")
    local c = client()
    local lock = assert(c:acquire("s:wait", 6, { replicas = 1 }))
    local w = helpers.spawn(helpers.spec_dir .. "workers/waiter.lua", table.concat(g.addrs, ",") .. ":mymaster",
                            "s:wait", 20, "notify", "plain", 0, "w")
    assert.is_truthy(helpers.eventually(5, function()
      return before:cli("INFO", "clients"):match("blocked_clients:(%d+)") == "1"
    end), "the waiter never blocked")
    g:failover()
    local switched = core.now()
    assert.is_true(lock:release()) -- on the new master (the lock was replicated)
    local out, ok = w.wait()
    assert.is_true(ok, out)
    local fence, got = out:match("^got w (%d+) ([%d.]+)")
    assert.is_truthy(fence, out)
    -- Within a second of the switch: the waiter looks for it between blocks
    -- of 0.5 s (Sentinel:wait), and its next try goes to the new master.
    assert.is_true(tonumber(got) - switched < 1 * helpers.slow, "got it " .. (tonumber(got) - switched) .. " s after")
    -- The last fence the new master handed out in the slot (the waiter
    -- released it since: the lock keeps none now).
    local m = g:master():raw()
    assert.are.equal(tonumber(fence), select(2, helpers.fence_record(m, "s:wait")))
    m:close()
    assert.is_nil(c:inspect("s:wait").fence)
    assert.is_true(tonumber(fence) > lock.fence, "a fence from the new master not above the old one's")
    c:close()
  end)

  it("renews on the new master after a failover (the watchdog follows)", function()
    local c = client()
    local before = g:master()
    -- The lock must reach the replica before the failover (replicas = 1:
    -- WAIT), which needs the replica's link up again after the last failover.
    assert.is_true(g:caught_up(), "the replica never caught up")
    local ran = c:with_lock("s:renew", 3, function(lock)
      local old, new = g:failover()
      assert.are.equal(before, old)
      -- Past the TTL, renewed on the new master all along.
      core.sleep(3.5)
      assert.are.equal(lock.token, new:cli("GET", "lock:{s:renew}"))
      assert.is_true(lock:check())
      return "done"
    end, { replicas = 1 })
    assert.are.equal("done", ran)
    c:close()
  end)

  -- Sentinel under OpenResty, in a real nginx (2 workers) in front of a real
  -- Sentinel group (spec/helpers.lua): each worker's client resolves the
  -- master over cosockets, its watch (a timer, redislock/ngx_watch.lua) hears
  -- +switch-master and moves the client, and renewals follow. The handlers are
  -- spec/support/ngx_app.lua's. LuaJIT pass only (nginx loads that build).
  describe("under OpenResty", function()
    if helpers.no_nginx(pending) then return end

    local nginx, tls_sentinel, tls_port

    lazy_setup(function()
      -- The file's group, and one more sentinel, with a password, on a TLS port (mutual TLS) beside
      -- its plaintext one (for the checks).
      local certs = helpers.tls_certs()
      tls_port = helpers.free_port()
      tls_sentinel = g:extra_sentinel({ "requirepass s3cret", "tls-port " .. tls_port,
                                        "tls-cert-file " .. certs .. "/server.crt",
                                        "tls-key-file " .. certs .. "/server.key",
                                        "tls-ca-cert-file " .. certs .. "/ca.crt", "tls-auth-clients yes" })
      tls_sentinel.password = "s3cret"
      local location = helpers.location
      nginx = helpers.start_nginx({
        workers = 2,
        http = { "lua_socket_log_errors off;", "lua_ssl_trusted_certificate " .. certs .. "/ca.crt;",
                 "lua_ssl_verify_depth 2;" },
        servers = {
          {
            'set $redis_sentinels "' .. table.concat(g.addrs, ",") .. '";',
            'set $redis_master "mymaster";',
            location("/acquire", "acquire"),
            location("/with_lock", "with_lock"),
            location("/election", "election"),
            location("/master", "master"),
            location("/section", "section"),
          },
          { -- the same, for a master of its own (Group:quiet_master)
            name = "quiet",
            'set $redis_sentinels "' .. g.addrs[1] .. '";',
            'set $redis_master "quiet";',
            location("/acquire", "acquire"),
            location("/master", "master"),
          },
          { -- through the TLS sentinel, with its password
            name = "tls",
            'set $redis_sentinels "127.0.0.1:' .. tls_port .. '";',
            'set $redis_master "mymaster";',
            'set $redis_sentinel_tls "mtls";',
            'set $redis_sentinel_password "s3cret";',
            'set $redis_tls_dir "' .. certs .. '";',
            location("/acquire", "acquire"),
            location("/nodes/new", "new", 'set $redis_tls "mtls";'),
            location("/noname/new", "new", 'set $redis_sentinel_tls "nonamemtls";'),
          },
        },
      })
    end)
    lazy_teardown(function()
      if nginx then nginx:stop() end
    end)

    local function get(path)
      return http.request(nginx.port, "GET", path)
    end

    -- Asks until both workers answered /master; returns their ports by pid.
    local function masters()
      local seen, n = {}, 0
      for _ = 1, 50 do
        local status, body = get("/master")
        assert.are.equal(200, status, body)
        local port, pid = body:match("^(%d+) (%d+)")
        if not seen[pid] then n = n + 1 end
        seen[pid] = tonumber(port)
        if n == 2 then break end
      end
      assert.are.equal(2, n, "only one worker answered")
      return seen
    end

    it("runs an election over cosockets: campaign, leader, proclaim, observe, resign, terms growing", function()
      nginx:elections()
    end)

    it("takes locks on the master the sentinels name, in every worker", function()
      local m = g:master()
      for _ = 1, 4 do
        local status, body = get("/acquire?key=o:" .. _ .. "&ttl=5")
        assert.are.equal(200, status, body .. nginx:error_log())
        local token = body:match("^%d+ (%S+)")
        assert.are.equal(token, m:cli("GET", "lock:{o:" .. _ .. "}"))
      end
      for _, port in pairs(masters()) do assert.are.equal(m.port, port) end
    end)

    it("takes no lock on a node demoted without a word from the sentinels (ROLE on each new connection)", function()
      local q = g:quiet_master()
      finally(function() q:stop() end)
      local function quiet(path)
        return http.request(nginx.port, "GET", path, { headers = { Host = "quiet" } })
      end
      for i = 1, 6 do -- both workers, most likely; each pools connections to the old master
        local status, body = quiet("/acquire?key=o:quiet:before" .. i .. "&ttl=5")
        assert.are.equal(200, status, body .. nginx:error_log())
      end
      q:demote() -- no +switch-master: the watch hears nothing
      for i = 1, 6 do
        local status, body = quiet("/acquire?key=o:quiet" .. i .. "&ttl=5")
        assert.are.equal(200, status, body .. nginx:error_log())
        assert.are.equal(body:match("^%d+ (%S+)"), q.new:cli("GET", "lock:{o:quiet" .. i .. "}"))
      end
    end)

    it("talks TLS and AUTH to a sentinel, and watches it over that connection (sentinel_tls)", function()
      local function tls(path)
        return http.request(nginx.port, "GET", path, { headers = { Host = "tls" } })
      end
      local m = g:master()
      for i = 1, 4 do
        local status, body = tls("/acquire?key=o:tls" .. i .. "&ttl=5")
        assert.are.equal(200, status, body .. nginx:error_log())
        assert.are.equal(body:match("^%d+ (%S+)"), m:cli("GET", "lock:{o:tls" .. i .. "}"))
      end
      -- The watch's subscription, on the TLS port (subscribed: authenticated).
      assert.is_truthy(helpers.eventually(5, function()
        for line in tls_sentinel:cli("CLIENT", "LIST"):gmatch("[^\n]+") do
          if line:find("laddr=127.0.0.1:" .. tls_port, 1, true) and line:find(" sub=1 ", 1, true) then
            return true
          end
        end
      end), tls_sentinel:cli("CLIENT", "LIST"))
      -- The nodes' TLS needs a DNS name to check under OpenResty: the
      -- sentinels name nodes by address.
      local status, body = tls("/nodes/new")
      assert.are.equal(500, status)
      assert.matches("TLS to the nodes behind Sentinel needs 'tls.server_name'", body, 1, true)
      status, body = tls("/noname/new")
      assert.are.equal(500, status)
      assert.matches("'sentinel_tls' to sentinels given as addresses needs 'sentinel_tls.server_name'", body, 1, true)
    end)

    it("keeps concurrent with_lock loops going across a failover: no overlaps, none on the demoted master", function()
      if helpers.slow > 1 then return pending("timing-bound: not under REDISLOCK_SLOW") end
      assert.is_true(g:caught_up(), "the replica never caught up")
      g:loops_across_failover(function(start_at)
        return helpers.spawn(helpers.spec_dir .. "workers/http_loop.lua", nginx.port, "/section?key=o:loop", 6,
                             start_at)
      end)
    end)

    it("lets a request waiting on the old master take the lock on the new one within a second of the switch", function()
      local before = g:master()
      assert.is_true(g:caught_up(), "the replica never caught up")
      local replica = before == g.nodes[1] and g.nodes[2] or g.nodes[1]
      local holder = require("redislock").new({ sentinels = g.addrs, master = g.name })
      local lock = assert(holder:acquire("o:wait", 8))
      assert.is_truthy(helpers.eventually(10, function() return replica:cli("EXISTS", "lock:{o:wait}") == "1" end))
      local waiting = http.start(nginx.port, "GET", "/acquire?key=o:wait&ttl=5&wait=20", { timeout = 30 })
      assert.is_truthy(helpers.eventually(5, function()
        return before:cli("INFO", "clients"):match("blocked_clients:(%d+)") == "1"
      end), "the request never blocked")
      local _, new = g:failover()
      local switched = core.now()
      assert.is_true(lock:release()) -- on the new master
      local status, body = waiting:finish()
      local took = core.now() - switched
      assert.are.equal(200, status, body .. nginx:error_log())
      assert.are.equal(body:match("^%d+ (%S+)"), new:cli("GET", "lock:{o:wait}"))
      assert.is_true(took < 1 * helpers.slow, "took " .. took .. " s after the switch")
      holder:close()
    end)

    it("follows a failover at once in every worker, and renews a held lock on the new master", function()
      local before = g:master()
      assert.is_true(g:caught_up(), "the replica never caught up")
      masters() -- both workers resolved (and watch) before the failover
      -- A lock held across the failover (ttl 3 s, held 8 s): renewed by the
      -- worker's timer, on the new master once the switch is heard.
      local hold = http.start(nginx.port, "GET", "/with_lock?key=o:held&ttl=3&hold=8", { timeout = 30 })
      assert.is_truthy(helpers.eventually(5, function() return before:cli("EXISTS", "lock:{o:held}") == "1" end))
      -- On the replica too: a lock the replica never got is lost at the
      -- promotion, and the renewal timer rightly says so (right after the
      -- failover of the test before, half a second was not always enough).
      local replica = before == g.nodes[1] and g.nodes[2] or g.nodes[1]
      assert.is_truthy(helpers.eventually(10, function() return replica:cli("EXISTS", "lock:{o:held}") == "1" end),
                       "the lock never reached the replica")
      local old, new = g:failover()
      assert.are.equal(before, old)
      -- Every worker moved as soon as the switch was announced, while the old
      -- master still takes writes: the next locks are on the new master.
      for pid, port in pairs(masters()) do assert.are.equal(new.port, port, "worker " .. pid) end
      for i = 1, 4 do
        local status, body = get("/acquire?key=o:after" .. i .. "&ttl=5")
        assert.are.equal(200, status, body .. nginx:error_log())
        assert.are.equal(body:match("^%d+ (%S+)"), new:cli("GET", "lock:{o:after" .. i .. "}"))
      end
      local status, body = hold:finish()
      assert.are.equal(200, status, body .. nginx:error_log())
    end)

    it("refuses a node that the sentinels name but that is not a master, naming the role its connections heard",
       function()
      -- A quiet master made a replica while the sentinel still names it
      -- (servers of its own: the group's failovers do not touch them): each
      -- new connection's ROLE says slave (the ones it had are closed, so no
      -- pooled one answers ROLE itself).
      local q = g:quiet_master()
      finally(function() q:stop() end)
      local replica = q.old
      assert.are.equal("OK", replica:cli("REPLICAOF", "127.0.0.1", tostring(q.new.port)))
      assert.matches("^slave\n", replica:cli("ROLE"))
      replica:cli("CLIENT", "KILL", "TYPE", "normal")
      local said = 0
      for i = 1, 6 do -- both workers, most likely
        local status, body = http.request(nginx.port, "GET", "/acquire?key=o:stale" .. i .. "&ttl=5",
                                          { headers = { Host = "quiet" } })
        -- A worker whose client still points at the quiet master of a case
        -- before (stopped) cannot connect once, then asks the sentinels.
        if status ~= 503 then
          assert.are.equal(502, status, body)
          assert.matches('^redis: READONLY 127%.0%.0%.1:' .. replica.port .. ', named master "quiet" by the '
                         .. 'sentinels, says ROLE slave, not master %(asked 5 times%)', body)
          said = said + 1
        end
      end
      assert.is_true(said >= 4, said .. " of 6 requests were refused by ROLE")
      assert.are.equal("0", replica:cli("EXISTS", "lock:{o:stale1}"))
    end)
  end)
end)
