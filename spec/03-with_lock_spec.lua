-- SPDX-License-Identifier: MIT
-- with_lock: results, errors, busy, lost, yielding, and Lua 5.4's <close>.
local core = require("redislock.core")
local redislock = require("redislock")
local helpers = require("spec.helpers")
local http = require("spec.support.http")

describe("with_lock", function()
  local srv, client, raw

  helpers.client_each(function(s, r, c) srv, raw, client = s, r, c end)

  local function held(key)
    return raw:command("EXISTS", "lock:{" .. key .. "}") == 1
  end

  it("runs fn holding the lock and returns exactly what fn returned", function()
    local seen
    local r = table.pack and table.pack or function(...) return { n = select("#", ...), ... } end
    local res = r(client:with_lock("k", 5, function(lock)
      seen = lock
      assert.are.equal(lock.token, raw:command("GET", "lock:{k}"))
      return 1, nil, "three", nil
    end))
    assert.are.equal(4, res.n)
    assert.are.equal(1, res[1])
    assert.is_nil(res[2])
    assert.are.equal("three", res[3])
    assert.is_truthy(seen.fence)
    assert.is_false(held("k"))
    assert.are.equal(0, select("#", client:with_lock("k", 5, function() end)))
  end)

  it("re-raises a string error unchanged after releasing", function()
    local ok, err = pcall(client.with_lock, client, "k", 5, function() error("boom", 0) end)
    assert.is_false(ok)
    assert.are.equal("boom", err)
    assert.is_false(held("k"))
  end)

  it("re-raises a table error as the very same table after releasing", function()
    local e = { code = 42 }
    local ok, err = pcall(client.with_lock, client, "k", 5, function() error(e) end)
    assert.is_false(ok)
    assert.is_true(rawequal(e, err))
    assert.is_false(held("k"))
  end)

  it("re-raises a nil error value after releasing", function()
    local ok, err = pcall(client.with_lock, client, "k", 5, function() error(nil) end)
    assert.is_false(ok)
    assert.is_nil(err)
    assert.is_false(held("k"))
  end)

  it("raises busy without calling fn when another owner holds the lock", function()
    local other = srv:client()
    local theirs = assert(other:acquire("k", 5))
    local called = false
    local ok, err = pcall(client.with_lock, client, "k", 5, function() called = true end)
    assert.is_false(ok)
    assert.is_truthy(err:match('^busy: "k"'), err)
    assert.is_false(called)
    assert.are.equal(theirs.token, raw:command("GET", "lock:{k}"))
    other:close()
  end)

  it("waits for the lock with the wait option", function()
    local other = srv:client()
    assert(other:acquire("k", 0.2))
    assert.are.equal("ran", client:with_lock("k", 5, function() return "ran" end, { wait = 3 }))
    other:close()
  end)

  it("raises lost when the lock expired and was taken while fn ran (renew = false)", function()
    local other = srv:client()
    local theirs
    local ok, err = pcall(client.with_lock, client, "k", 0.05, function()
      core.sleep(0.1)
      theirs = assert(other:acquire("k", 5))
      return "result that must not be trusted"
    end, { renew = false })
    assert.is_false(ok)
    assert.is_truthy(err:match('^lost: "k" is no longer ours %(another owner holds it now'), err)
    assert.are.equal(theirs.token, raw:command("GET", "lock:{k}"))
    other:close()
  end)

  it("raises lost when the lock expired while fn ran (renew = false)", function()
    local ok, err = pcall(client.with_lock, client, "k", 0.05, function() core.sleep(0.1) end, { renew = false })
    assert.is_false(ok)
    assert.is_truthy(err:match('^lost: "k" is no longer ours %(it expired'), err)
  end)

  it("lets fn yield inside a coroutine and releases when it finishes", function()
    local co = coroutine.create(function()
      return client:with_lock("k", 5, function(lock)
        local got = coroutine.yield(lock.fence)
        return got * 2
      end)
    end)
    local ok, fence = coroutine.resume(co)
    assert.is_true(ok, fence)
    assert.is_truthy(fence)
    assert.are.equal("suspended", coroutine.status(co))
    assert.is_true(held("k"))
    local ok2, doubled = coroutine.resume(co, 21)
    assert.is_true(ok2, doubled)
    assert.are.equal(42, doubled)
    assert.are.equal("dead", coroutine.status(co))
    assert.is_false(held("k"))
  end)

  it("releases when fn raises after yielding", function()
    local co = coroutine.create(function()
      return client:with_lock("k", 5, function()
        coroutine.yield()
        error({ "late" })
      end)
    end)
    assert.is_true((coroutine.resume(co)))
    assert.is_true(held("k"))
    local ok, err = coroutine.resume(co)
    assert.is_false(ok)
    assert.are.same({ "late" }, err)
    assert.is_false(held("k"))
  end)

  it("re-raises fn's error even when fn closed the client, so release could not run", function()
    local c = srv:client()
    local e = { tag = "mine" }
    local ok, err = pcall(c.with_lock, c, "k", 0.5, function()
      c:close()
      error(e)
    end)
    assert.is_false(ok)
    assert.is_true(rawequal(e, err))
  end)

  it("raises, not returns, when fn closed the client and release could not run", function()
    local c = srv:client()
    local ok, err = pcall(c.with_lock, c, "k", 0.5, function() c:close() return 1 end)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("client is closed", 1, true), err)
  end)

  it("is also a module function on the client from REDIS_URL", function()
    local code = [[
      local redislock = require("redislock")
      print(redislock.with_lock("mod", 5, function(lock) return "fence " .. lock.fence end))
    ]]
    local out, ok = helpers.run("REDIS_URL=" .. helpers.sh_quote(srv.url .. "/4") .. " " ..
                                helpers.lua .. " -e " .. helpers.sh_quote(code))
    assert.is_true(ok, out)
    local fence = assert(out:match("^fence (%d+)"), out)
    -- Taken in db 4 and given back: nothing of the name is left, and the
    -- slot's fence record there stands for the fence it had.
    assert.are.equal("0", srv:cli("-n", "4", "EXISTS", "lock:{mod}", "lock:{mod}:fence"))
    local db4 = core.new({ port = srv.port, db = 4 })
    local _, top = helpers.fence_record(db4, "mod")
    db4:close()
    assert.are.equal(tonumber(fence), top)
  end)

  it("makes a new default client after the old one was closed", function()
    local code = [[
      local redislock = require("redislock")
      redislock.default_client():close()
      print(redislock.with_lock("again", 5, function() return "ran" end))
    ]]
    local out, ok = helpers.run("REDIS_URL=" .. helpers.sh_quote(srv.url) .. " " ..
                                helpers.lua .. " -e " .. helpers.sh_quote(code))
    assert.is_true(ok, out)
    assert.are.equal("ran\n", out)
  end)

  it("defaults to 127.0.0.1:6379 without REDIS_URL", function()
    local out, ok = helpers.run("env -u REDIS_URL " .. helpers.lua .. " -e " ..
      helpers.sh_quote('print(tostring(require("redislock").default_client()))'))
    assert.is_true(ok, out)
    assert.is_truthy(out:find("127.0.0.1:6379", 1, true), out)
  end)

  it("says clearly when REDIS_URL is not usable", function()
    local out, ok = helpers.run("REDIS_URL=http://x " .. helpers.lua .. " -e " ..
      helpers.sh_quote('require("redislock").with_lock("k", 1, function() end)'))
    assert.is_false(ok)
    assert.is_truthy(out:find("REDIS_URL is not usable", 1, true), out)
  end)

  describe("<close> (Lua 5.4)", function()
    if _VERSION ~= "Lua 5.4" then
      pending("to-be-closed variables need Lua 5.4; " .. _VERSION .. " has none")
      return
    end

    it("releases at scope exit", function()
      local run = assert(load([[
        local client, held = ...
        do
          local lock <close> = assert(client:acquire("k", 5))
          assert(held("k"))
        end
        return held("k")
      ]]))
      assert.is_false(run(client, held))
    end)

    it("releases when the scope is left by an error, and keeps that error", function()
      local run = assert(load([[
        local client = ...
        local lock <close> = assert(client:acquire("k", 5))
        error("inside", 0)
      ]]))
      local ok, err = pcall(run, client)
      assert.is_false(ok)
      assert.are.equal("inside", err)
      assert.is_false(held("k"))
    end)

    it("releases when a coroutine suspended inside with_lock is closed", function()
      local co = coroutine.create(function()
        return client:with_lock("k", 30, function() coroutine.yield() end)
      end)
      assert.is_true((coroutine.resume(co)))
      assert.is_true(held("k"))
      assert.is_true(coroutine.close(co))
      assert.is_false(held("k"))
    end)

    it("takes clients as <close> variables too, closed before or after their locks without an error", function()
      local run = assert(load([[
        local srv, first = ...
        local c = srv:client()
        if first == "client" then
          local lock <close> = assert(c:acquire("k", 5))
          local client <close> = c -- closed first: the lock then runs out by its TTL
          return lock
        end
        local client <close> = c
        local lock <close> = assert(c:acquire("k", 5)) -- released first
        return lock, client
      ]]))
      local lock = run(srv, "lock")
      assert.are.equal("released", lock._state)
      assert.is_false(held("k"))
      assert.is_truthy(tostring(select(2, run(srv, "lock"))):find("closed", 1, true))
      assert.is_false(held("k"))
      lock = run(srv, "client")
      assert.is_true(held("k"))
      local ok, err = lock:release()
      assert.is_nil(ok)
      assert.is_truthy(err:match("^connection: the lock's client is closed"), err)
      assert.are.equal(1, raw:command("DEL", "lock:{k}"))
    end)

    it("keeps the scope's error even when the lock's client was closed", function()
      local run = assert(load([[
        local c = ...
        local lock <close> = assert(c:acquire("k", 5))
        c:close()
        error({ mine = true })
      ]]))
      local c = srv:client()
      local ok, err = pcall(run, c)
      assert.is_false(ok)
      assert.are.same({ mine = true }, err)
    end)

    it("raises lost at scope exit when the lock was lost", function()
      local run = assert(load([[
        local client, sleep = ...
        local lock <close> = assert(client:acquire("k", 0.05))
        sleep(0.1)
      ]]))
      local ok, err = pcall(run, client, core.sleep)
      assert.is_false(ok)
      assert.is_truthy(err:match('^lost: "k"'), err)
    end)
  end)

  it("never releases from the garbage collector", function()
    do
      assert(client:acquire("gc", 5))
    end
    collectgarbage()
    collectgarbage()
    assert.is_true(held("gc"))
  end)

  it("accepts a callable table as fn", function()
    local callable = setmetatable({}, { __call = function(_, lock) return lock.key end })
    assert.are.equal("k", client:with_lock("k", 5, callable))
    assert.is_truthy(redislock._VERSION)
  end)

  -- Under OpenResty, in a real nginx with the lua module: with_lock's error
  -- paths, renewal by the worker's timer, and the phases without cosockets.
  -- The handlers are spec/support/ngx_app.lua's. LuaJIT pass only (nginx
  -- loads that build).
  describe("under OpenResty", function()
    if helpers.no_nginx(pending) then return end

    describe("errors", function()
      local ngx = helpers.app_nginx_for(function() return srv end, 1)

      it("answers connection when Redis is down", function()
        local status, body = http.request(ngx.port, "GET", "/dead/acquire?key=k")
        assert.are.equal(503, status)
        assert.is_truthy(body:match("^connection: cannot connect to 127%.0%.0%.1:%d+ %(connection refused%)"), body)
        assert.are.equal("connect", core.error_class((body:gsub("\n$", "")))) -- as the C transport's (spec/05)
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
        assert.are.equal("timeout", core.error_class((body:gsub("\n$", ""))))
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
        -- resend of the acquire script, which sets the lock again if it is
        -- gone).
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
        err = headers["x-redislock-command-error"]
        assert.is_truthy(err and err:find("redislock: 'command' cannot run in nginx's header_filter phase:", 1, true),
                         err)
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
  end)
end)
