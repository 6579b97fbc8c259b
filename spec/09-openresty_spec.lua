-- SPDX-License-Identifier: MIT
-- redislock inside a real nginx with the lua module (Debian's OpenResty stack):
-- cosockets, the connection pool, waiting that does not block the worker,
-- mutual exclusion under 200 concurrent requests, and the error paths.
-- The handlers are spec/support/ngx_app.lua. nginx loads the LuaJIT build of
-- the C core whichever interpreter runs busted, so these run in the LuaJIT
-- pass of `make test` only.
local core = require "redislock.core"
local helpers = require "spec.helpers"
local http = require "spec.support.http"

-- nginx.conf lines for a location running handler `name` of ngx_app.
local function handler(path, name, extra)
  return string.format('location = %s { %s content_by_lua_block { require("spec.support.ngx_app").%s() } }',
                       path, extra or "", name)
end

-- The server block every instance gets; %s are the redis URLs.
local function server_conf(url, dead_url, unix_url, auth_url, badauth_url)
  return table.concat({
    "lua_socket_log_errors off;",
    "server {",
    "  listen 127.0.0.1:{{port}} reuseport;",
    '  set $redis_url "' .. url .. '";',
    '  set $redis_timeout "";',
    handler("/counter", "counter"),
    handler("/acquire", "acquire"),
    handler("/reenter", "reenter"),
    handler("/release", "release"),
    handler("/ping", "ping"),
    handler("/with_lock", "with_lock"),
    handler("/module", "module"),
    handler("/raise", "raise"),
    handler("/raise_table", "raise_table"),
    handler("/leave", "leave"),
    handler("/drop", "drop"),
    '  location = /guarded { access_by_lua_block { require("spec.support.ngx_app").leave() }',
    '                        content_by_lua_block { ngx.say("not reached") } }',
    handler("/dead/acquire", "acquire", 'set $redis_url "' .. dead_url .. '";'),
    handler("/slow/acquire", "acquire", 'set $redis_timeout 0.2;'),
    handler("/unix/acquire", "acquire", 'set $redis_url "' .. unix_url .. '";'),
    handler("/auth/acquire", "acquire", 'set $redis_url "' .. auth_url .. '";'),
    handler("/badauth/acquire", "acquire", 'set $redis_url "' .. badauth_url .. '";'),
    "  location = /phase {",
    '    content_by_lua_block { ngx.say("body") }',
    '    header_filter_by_lua_block { require("spec.support.ngx_app").header_filter() }',
    '    log_by_lua_block { require("spec.support.ngx_app").log() }',
    "  }",
    "}",
  }, "\n")
end

-- Starts nginx with `workers` worker processes against srv.
local function start(srv, workers)
  local url = "redis://127.0.0.1:" .. srv.port
  return helpers.start_nginx({
    workers = workers,
    main = "env REDIS_URL=" .. url .. ";",
    http = server_conf(url, "redis://127.0.0.1:" .. helpers.free_port(), "unix://" .. srv.sock,
                       "redis://locker:s3cret@127.0.0.1:" .. srv.port .. "/3",
                       "redis://locker:wrong@127.0.0.1:" .. srv.port),
  })
end

-- n concurrent GETs of path; returns the responses.
local function burst(ngx, n, path)
  local reqs = {}
  for i = 1, n do reqs[i] = path end
  return http.parallel(ngx.port, reqs, { timeout = 120 * helpers.slow })
end

describe("OpenResty", function()
  if not jit then
    pending("runs in the LuaJIT pass of make test (nginx loads the LuaJIT build)")
    return
  end

  local srv, raw

  helpers.redis_for(lazy_setup, lazy_teardown, function(s, r) srv, raw = s, r end)
  lazy_setup(function()
    assert(raw:command("ACL", "SETUSER", "locker", "on", ">s3cret", "~*", "&*", "+@all"))
  end)
  before_each(function()
    assert.are.equal("OK", raw:command("FLUSHALL"))
  end)

  -- Runs the read-modify-write burst; returns the final count, the overlaps
  -- seen, and how many worker processes served the requests.
  local function counter_run(ngx, n, lock)
    assert.are.equal("OK", raw:command("FLUSHALL"))
    local pids, workers = {}, 0
    for i, res in ipairs(burst(ngx, n, "/counter" .. (lock and "?lock=" .. lock or ""))) do
      assert.are.equal(200, res.status, "request " .. i .. ": " .. res.body .. ngx:error_log())
      local pid = res.headers["x-worker"]
      if not pids[pid] then workers, pids[pid] = workers + 1, true end
    end
    return tonumber(raw:command("GET", "counter")), tonumber(raw:command("GET", "overlaps")) or 0, workers
  end

  -- How many clients are blocked in the server (a waiter's BLPOP).
  local function blocked()
    return tonumber(raw:command("INFO", "clients"):match("blocked_clients:(%d+)"))
  end

  for _, workers in ipairs({ 2, 1 }) do
    describe("with " .. workers .. " worker process" .. (workers > 1 and "es" or ""), function()
      local ngx

      lazy_setup(function() ngx = start(srv, workers) end)
      lazy_teardown(function() if ngx then ngx:stop() end end)

      it("loses updates in 200 concurrent read-modify-writes without a lock (the race is real)", function()
        local count, overlaps = counter_run(ngx, 200, nil)
        assert.is_true(count < 200, "without a lock all 200 updates survived: " .. count)
        assert.is_true(overlaps > 0)
      end)

      for _, mode in ipairs({ "notify", "poll", "fair" }) do
        it("keeps 200 concurrent read-modify-writes exact under with_lock (" .. mode .. ")", function()
          local count, overlaps, served_by = counter_run(ngx, 200, mode)
          assert.are.equal(200, count)
          assert.are.equal(0, overlaps)
          assert.are.equal(workers, served_by)
        end)
      end

      -- With one worker, /ping and the waiting request share it.
      if workers == 1 then it("serves other requests while one waits for a busy lock", function()
        local holder = srv:client()
        local lock = assert(holder:acquire("busy", 30))
        local waiting = http.start(ngx.port, "GET", "/acquire?key=busy&wait=2")
        -- The waiting request is waiting once its BLPOP blocks in the server.
        assert.is_truthy(helpers.eventually(2, function() return blocked() == 1 end))
        local status, body = http.request(ngx.port, "GET", "/ping")
        assert.are.equal(200, status)
        assert.are.equal("pong\n", body)
        assert.is_false(waiting:ready(), "the waiting request ended before /ping was answered")
        local wstatus, wbody = waiting:finish()
        assert.are.equal(409, wstatus)
        assert.is_truthy(wbody:match('^busy: "busy" is still held by another owner after waiting 2 s'), wbody)
        -- A waiter gets the lock soon after the holder lets go.
        waiting = http.start(ngx.port, "GET", "/acquire?key=busy&wait=20")
        assert.is_truthy(helpers.eventually(2, function() return blocked() == 1 end))
        assert.is_true(lock:release())
        wstatus, wbody = waiting:finish()
        assert.are.equal(200, wstatus, wbody)
        holder:close()
      end) end

      -- One worker: its requests share its client.
      if workers == 1 then it("tells a lock another request of the worker holds from one this request holds", function()
        local holding = http.start(ngx.port, "GET", "/with_lock?key=shared&hold=1")
        assert.is_truthy(helpers.eventually(2, function() return raw:command("EXISTS", "lock:{shared}") == 1 end))
        local status, body = http.request(ngx.port, "GET", "/acquire?key=shared")
        assert.are.equal(409, status)
        assert.is_truthy(body:match('^busy: "shared" is held by another request of this nginx worker '
                                    .. '%([%d.]+ s left%)'), body)
        assert.are.equal(200, (holding:finish()))
        status, body = http.request(ngx.port, "GET", "/reenter?key=again")
        assert.are.equal(200, status)
        assert.is_truthy(body:match('^busy: "again" is held by this request %(locks are not reentrant; '), body)
        status, body = http.request(ngx.port, "GET", "/reenter?key=doc&rw=1")
        assert.are.equal(200, status)
        assert.is_truthy(body:find("this caller holds a read lock on it, which does not turn into the write lock: "
                                   .. "release it first", 1, true), body)
      end) end

      it("uses nginx's connection pool instead of a connection per call", function()
        local before = tonumber(srv:cli("INFO", "stats"):match("total_connections_received:(%d+)"))
        for _ = 1, 50 do
          local status = http.request(ngx.port, "GET", "/with_lock?key=pool")
          assert.are.equal(200, status)
        end
        local after = tonumber(srv:cli("INFO", "stats"):match("total_connections_received:(%d+)"))
        -- One redis-cli connection per INFO, and at most a connection or two
        -- per worker; 50 requests made 100 round trips.
        assert.is_true(after - before <= 1 + 2 * workers, "connections made: " .. (after - before))
      end)
    end)
  end

  describe("errors", function()
    local ngx

    lazy_setup(function() ngx = start(srv, 1) end)
    lazy_teardown(function() if ngx then ngx:stop() end end)

    it("answers connection when Redis is down", function()
      local status, body = http.request(ngx.port, "GET", "/dead/acquire?key=k")
      assert.are.equal(503, status)
      assert.is_truthy(body:match("^connection: cannot connect to 127%.0%.0%.1:%d+ %(connection refused%)"), body)
      -- lua_socket_log_errors off: nothing in nginx's log either.
      assert.is_nil(ngx:error_log():find("connect() failed", 1, true), ngx:error_log())
    end)

    it("answers connection when Redis does not answer within the timeout", function()
      -- Scripts wait while the server is paused (and CLIENT PAUSE takes
      -- effect before it answers).
      assert.are.equal("OK", raw:command("CLIENT", "PAUSE", 1000, "WRITE"))
      local status, body = http.request(ngx.port, "GET", "/slow/acquire?key=k")
      assert.are.equal(503, status)
      assert.is_truthy(body:match("^connection: 127%.0%.0%.1:%d+ did not answer within 0%.2 s %(timeout%)"), body)
      -- The server answers again afterwards, on a fresh connection. (Each
      -- try takes another key: one that timed out may still run once the
      -- server wakes, and then holds its key until the TTL.)
      local last, try = nil, 0
      assert.is_truthy(helpers.eventually(3, function()
        try = try + 1
        local st, b = http.request(ngx.port, "GET", "/slow/acquire?key=k" .. try)
        last = b
        return st == 200
      end), last)
    end)

    it("raises lost from with_lock when the lock expired while fn ran (renew = false)", function()
      local status, body = http.request(ngx.port, "GET", "/with_lock?key=short&ttl=0.1&hold=0.3&renew=0")
      assert.are.equal(409, status)
      assert.is_truthy(body:match('^lost: "short" is no longer ours %(it expired or was deleted'), body)
    end)

    it("raises lost from with_lock when another owner took the lock meanwhile (renew = false)", function()
      local req = http.start(ngx.port, "GET", "/with_lock?key=taken&ttl=0.2&hold=3&renew=0")
      assert.is_truthy(helpers.eventually(1, function() return raw:command("EXISTS", "lock:{taken}") == 1 end))
      local other = srv:client()
      local lock = helpers.eventually(2, function() return other:acquire("taken", 10) end)
      assert.is_truthy(lock, "the lock never expired")
      local status, body = req:finish()
      assert.are.equal(409, status)
      assert.is_truthy(body:match('^lost: "taken" is no longer ours %(another owner holds it now'), body)
      assert.are.equal(lock.token, raw:command("GET", "lock:{taken}"))
      other:close()
    end)

    it("renews the lock while fn runs past its TTL (the worker's renewal timer)", function()
      local req = http.start(ngx.port, "GET", "/with_lock?key=renewed&ttl=0.5&hold=1.8")
      assert.is_truthy(helpers.eventually(2, function() return raw:command("EXISTS", "lock:{renewed}") == 1 end))
      local other = srv:client()
      core.sleep(1) -- two TTLs
      local lock, err = other:acquire("renewed", 5)
      assert.is_nil(lock)
      assert.is_truthy(err:match("^busy: "), err)
      local status, body = req:finish()
      assert.are.equal(200, status, body)
      assert.are.equal(0, raw:command("EXISTS", "lock:{renewed}"))
      other:close()
    end)

    it("reports a lease the renewal timer found lost, through with_lock and on_lost", function()
      -- Deleted once fn runs: before, the acquire may still be at work (a
      -- take whose era the acquire script then checks, and which sets the
      -- lock again if it is gone).
      local req = http.start(ngx.port, "GET", "/with_lock?key=vanished&ttl=0.3&hold=1&on_lost=1&mark=1")
      assert.is_truthy(helpers.eventually(2, function() return raw:command("GET", "inside:vanished") == "1" end))
      assert.are.equal(1, raw:command("DEL", "lock:{vanished}"))
      local status, body = req:finish()
      assert.are.equal(409, status)
      assert.is_truthy(body:match('^lost: "vanished" is no longer ours %(it expired or was deleted; found by the '
                                  .. 'renewal timer%) | on_lost: lost: "vanished"'), body)
    end)

    -- ngx.exit, ngx.exec, ngx.redirect and ngx.thread.kill end fn's thread
    -- without unwinding: the lock must not outlive it (it was renewed for
    -- ever by the worker's timer before). Released at the next renewal (a
    -- third of the TTL), so well within the TTL of 1 s.
    for _, case in ipairs({ { "exit", 200, "bye" }, { "exec", 200, "pong" }, { "redirect", 302 },
                            { "kill", 200, "killed" }, { "access", 403, nil, "/guarded" } }) do
      local how, want_status, want_body, path = case[1], case[2], case[3], case[4] or "/leave"
      it("gives the lock back after " .. how .. " inside fn, within its TTL", function()
        local key = "left-" .. how
        local started = core.now()
        local status, body = http.request(ngx.port, "GET", path .. "?key=" .. key .. "&ttl=1&how=" .. how)
        assert.are.equal(want_status, status, body)
        if want_body then assert.are.equal(want_body .. "\n", body) end
        assert.is_true(core.now() - started < 0.9, "the request itself was held up")
        local gone = helpers.eventually(1, function() return raw:command("EXISTS", "lock:{" .. key .. "}") == 0 end)
        assert.is_truthy(gone, "the lock outlived its request thread")
        -- Released, not expired: gone before a TTL passed since the request.
        assert.is_true(core.now() - started < 1, string.format("gone only after %.2f s", core.now() - started))
      end)
    end

    it("does not hold up a request that dropped a coroutine suspended inside fn; the lock runs out", function()
      local started = core.now()
      local status, body = http.request(ngx.port, "GET", "/drop?key=dropped&ttl=0.5")
      assert.are.equal(200, status, body)
      assert.is_true(core.now() - started < 0.4, "the request was held up")
      -- Collected, so no longer renewed: it runs out by its TTL.
      assert.is_truthy(helpers.eventually(2, function() return raw:command("EXISTS", "lock:{dropped}") == 0 end))
    end)

    it("releases the lock when fn raises, and nginx answers 500 and logs the error", function()
      local status = http.request(ngx.port, "GET", "/raise")
      assert.are.equal(500, status)
      assert.are.equal(0, raw:command("EXISTS", "lock:{raising}"))
      assert.is_truthy(helpers.eventually(2, function() return ngx:error_log():find("boom from fn", 1, true) end))
      local _, body = http.request(ngx.port, "GET", "/raise_table")
      assert.are.equal("true\n", body)
      assert.are.equal(0, raw:command("EXISTS", "lock:{raising}"))
    end)

    it("refuses to do I/O in phases without cosockets, with a clear error", function()
      local status, _, headers = http.request(ngx.port, "GET", "/phase")
      assert.are.equal(200, status)
      local err = headers["x-redislock-error"]
      assert.is_truthy(err and err:find("redislock: 'acquire' cannot run in nginx's header_filter phase:"
                                        .. " cosockets are not available there", 1, true), err)
      assert.is_truthy(helpers.eventually(2, function()
        return ngx:error_log():find("log phase: redislock: 'acquire' cannot run in nginx's log phase", 1, true)
      end), ngx:error_log())
      assert.is_truthy(helpers.eventually(2, function()
        return ngx:error_log():find("log phase, module: redislock: 'with_lock' cannot run in nginx's log phase",
                                    1, true)
      end), ngx:error_log())
      assert.are.equal(0, raw:command("EXISTS", "lock:{phase}"))
    end)
  end)

  describe("connections", function()
    local ngx

    lazy_setup(function() ngx = start(srv, 1) end)
    lazy_teardown(function() if ngx then ngx:stop() end end)

    it("releases by key and token, and refuses a token that is not the holder's", function()
      local status, body = http.request(ngx.port, "GET", "/acquire?key=svc&ttl=30")
      assert.are.equal(200, status, body)
      local fence, token = body:match("^(%d+) (%S+)\n$")
      assert.are.equal("1", fence)
      assert.are.equal(token, raw:command("GET", "lock:{svc}"))
      local wrong = ("0"):rep(32)
      status, body = http.request(ngx.port, "GET", "/release?key=svc&token=" .. wrong)
      assert.are.equal(409, status)
      assert.is_truthy(body:match("^lost: "), body)
      status = http.request(ngx.port, "GET", "/release?key=svc&token=" .. token)
      assert.are.equal(200, status)
      assert.are.equal(0, raw:command("EXISTS", "lock:{svc}"))
    end)

    it("falls back to EVAL when the server lost its script cache", function()
      assert.are.equal(200, (http.request(ngx.port, "GET", "/acquire?key=a&ttl=1")))
      assert.are.equal("OK", raw:command("SCRIPT", "FLUSH"))
      local status, body = http.request(ngx.port, "GET", "/acquire?key=b&ttl=1")
      assert.are.equal(200, status, body)
    end)

    it("authenticates as an ACL user and selects the db on new connections", function()
      local status, body = http.request(ngx.port, "GET", "/auth/acquire?key=authed&ttl=30")
      assert.are.equal(200, status, body)
      assert.are.equal(0, raw:command("EXISTS", "lock:{authed}"))
      assert.are.equal("OK", raw:command("SELECT", 3))
      assert.are.equal(1, raw:command("EXISTS", "lock:{authed}"))
      assert.are.equal("OK", raw:command("SELECT", 0))
      status, body = http.request(ngx.port, "GET", "/badauth/acquire?key=k")
      assert.are.equal(502, status)
      assert.is_truthy(body:match("^redis: AUTH refused by 127%.0%.0%.1:%d+: WRONGPASS"), body)
    end)

    it("talks over a unix socket", function()
      local status, body = http.request(ngx.port, "GET", "/unix/acquire?key=u&ttl=30")
      assert.are.equal(200, status, body)
      assert.are.equal(1, raw:command("EXISTS", "lock:{u}"))
    end)

    it("examples/openresty/run.sh: every example does what it says", function()
      local out, ok = helpers.run("sh " .. helpers.sh_quote(helpers.root() .. "/examples/openresty/run.sh"))
      assert.is_true(ok, out)
      assert.is_truthy(out:find("stampede:  20 concurrent GET /report (2 workers): 20 x 200, 1 rebuild", 1, true), out)
      assert.is_truthy(out:find("ok: every example did what it says", 1, true), out)
    end)

    it("runs redislock.with_lock on the default client from REDIS_URL", function()
      local status, body = http.request(ngx.port, "GET", "/module")
      assert.are.equal(200, status, body)
      assert.are.equal("1 redislock.Client (127.0.0.1:" .. srv.port .. ", cosockets)\n", body)
    end)
  end)
end)
