-- SPDX-License-Identifier: MIT
-- Sentinel under OpenResty, in a real nginx (2 workers) in front of a real
-- Sentinel group (spec/helpers.lua): each worker's client resolves the
-- master over cosockets, its watch (a timer, redislock/ngx_watch.lua) hears
-- +switch-master and moves the client, and renewals follow. The handlers are
-- spec/support/ngx_app.lua's. LuaJIT pass only (nginx loads that build).
local core = require "redislock.core"
local helpers = require "spec.helpers"
local http = require "spec.support.http"

describe("OpenResty behind Sentinel", function()
  if not jit then
    pending("runs in the LuaJIT pass of make test (nginx loads the LuaJIT build)")
    return
  end

  local g, nginx, tls_sentinel, tls_port

  lazy_setup(function()
    g = helpers.start_sentinels()
    -- One more sentinel, with a password, on a TLS port (mutual TLS) beside
    -- its plaintext one (for the checks).
    local certs = helpers.tls_certs()
    tls_port = helpers.free_port()
    tls_sentinel = g:extra_sentinel({ "requirepass s3cret", "tls-port " .. tls_port,
                                      "tls-cert-file " .. certs .. "/server.crt",
                                      "tls-key-file " .. certs .. "/server.key",
                                      "tls-ca-cert-file " .. certs .. "/ca.crt", "tls-auth-clients yes" })
    tls_sentinel.password = "s3cret"
    local function location(path, name, more)
      return string.format("location = %s { %s content_by_lua_block { require('spec.support.ngx_app').%s() } }",
                           path, more or "", name)
    end
    nginx = helpers.start_nginx({
      workers = 2,
      http = table.concat({
        "lua_socket_log_errors off;",
        "lua_ssl_trusted_certificate " .. certs .. "/ca.crt;",
        "lua_ssl_verify_depth 2;",
        "server {",
        "  listen 127.0.0.1:{{port}};",
        '  set $redis_sentinels "' .. table.concat(g.addrs, ",") .. '";',
        '  set $redis_master "mymaster";',
        location("/acquire", "acquire"),
        location("/with_lock", "with_lock"),
        location("/master", "master"),
        location("/section", "section"),
        "}",
        "server {", -- the same, for a master of its own (Group:quiet_master)
        "  listen 127.0.0.1:{{port}};",
        "  server_name quiet;",
        '  set $redis_sentinels "' .. g.addrs[1] .. '";',
        '  set $redis_master "quiet";',
        location("/acquire", "acquire"),
        location("/master", "master"),
        "}",
        "server {", -- through the TLS sentinel, with its password
        "  listen 127.0.0.1:{{port}};",
        "  server_name tls;",
        '  set $redis_sentinels "127.0.0.1:' .. tls_port .. '";',
        '  set $redis_master "mymaster";',
        '  set $redis_sentinel_tls "mtls";',
        '  set $redis_sentinel_password "s3cret";',
        '  set $redis_tls_dir "' .. certs .. '";',
        location("/acquire", "acquire"),
        location("/nodes/new", "new", 'set $redis_tls "mtls";'),
        location("/noname/new", "new", 'set $redis_sentinel_tls "nonamemtls";'),
        "}",
      }, "\n"),
    })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
    if g then g:stop() end
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
end)
