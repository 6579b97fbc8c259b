-- SPDX-License-Identifier: MIT
-- run.sh: long 50 (its seconds on a loaded 2-core machine: spec/run.sh starts it early; make check skips it)
-- Redlock over five independent redis-servers (appendonly, appendfsync
-- always; spec/helpers.lua), started once for this file: a majority holds
-- the lock, servers stopped (SIGSTOP) or down do not break it while a
-- majority answers, and the fence grows across quorums (the two-phase
-- write-back). In plain Lua, and under OpenResty in a real nginx.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")
local redislock = require("redislock")

describe("Redlock", function()
  local servers, urls

  lazy_setup(function() servers, urls = helpers.start_redlock(5) end)
  lazy_teardown(function()
    for _, s in ipairs(servers or {}) do
      os.execute("kill -CONT " .. s.pid .. " 2>/dev/null")
      s:stop()
    end
  end)

  local function client(extra)
    local list = {}
    for i, s in ipairs(servers) do list[i] = s.url end
    local o = { redlock = list }
    for k, v in pairs(extra or {}) do o[k] = v end
    return redislock.new(o)
  end

  -- Stops (SIGSTOP) the servers at the given indexes until the returned
  -- function is called.
  local function pause(...)
    local which = { ... }
    for _, i in ipairs(which) do os.execute("kill -STOP " .. servers[i].pid) end
    return function()
      for _, i in ipairs(which) do os.execute("kill -CONT " .. servers[i].pid) end
    end
  end

  -- How many servers hold key's lock with token.
  local function holders(key, token)
    local n = 0
    for _, s in ipairs(servers) do
      if s:cli("GET", "lock:{" .. key .. "}") == token then n = n + 1 end
    end
    return n
  end

  it("takes multi-key locks (one key after another, each by quorum) and refuses semaphores and rwlocks", function()
    local c = client()
    -- A TTL of 30 s gives each server a second to answer (a tenth of the
    -- TTL, at most the client's timeout): on a loaded machine one of five
    -- took longer than half a second, and held no copy.
    local lock = assert(c:acquire({ "rl:b", "rl:a" }, 30))
    assert.are.equal(5, holders("rl:a", lock.token))
    assert.are.equal(5, holders("rl:b", lock.token))
    assert.is_nil(c:acquire("rl:a", 5))
    assert(lock:release())
    assert.are.equal(0, holders("rl:a", lock.token) + holders("rl:b", lock.token))
    assert.has_error(function() c:semaphore("rl:pool", 2) end,
                     "bad argument #1 to 'semaphore' (a semaphore is not available with 'redlock' (its scripts count"
                       .. " holders on one server; use a client of one server, Sentinel or a cluster))")
    assert.has_error(function() c:rwlock("rl:doc") end)
    c:close()
  end)

  it("takes the lock on every server, as a single-server lock there, and releases it everywhere", function()
    local c = client()
    local lock = assert(c:acquire("r:1", 30)) -- each server has a second to answer (see above)
    assert.are.equal(5, holders("r:1", lock.token))
    assert.is_true(lock.fence >= 1)
    local ttl = assert(lock:ttl())
    -- Redlock's validity: 30 s less the acquire's time (1.5 s on a loaded machine).
    assert.is_true(ttl > 30 / 2 and ttl <= 30, ttl)
    -- A single-server client on any of them sees it held.
    local single = servers[3]:client()
    local other, err = single:acquire("r:1", 5)
    assert.is_nil(other)
    assert.matches("^busy:", err)
    single:close()
    assert.is_true(lock:release())
    assert.are.equal(0, holders("r:1", lock.token))
    assert.matches("Redlock over 5 servers", tostring(c))
    c:close()
  end)

  it("keeps several processes out of each other's sections (an exact counter)", function()
    local counter = servers[1]
    local raw = counter:raw()
    assert(raw:command("DEL", "counter", "inside", "fences"))
    assert(raw:command("SET", "counter", 0))
    local start_at = core.now() + 0.5
    local procs = {}
    for i = 1, 6 do
      procs[i] = helpers.spawn(helpers.spec_dir .. "workers/counter.lua", "redlock:" .. urls, "poll", 25, start_at,
                               counter.port)
    end
    for i = 1, #procs do
      local out, ok = procs[i].wait()
      assert.is_true(ok, out)
      assert.are.equal("overlaps 0", out:match("overlaps %d+"))
    end
    assert.are.equal(150, tonumber(raw:command("GET", "counter")))
    local fences = raw:command("LRANGE", "fences", 0, -1)
    for i = 2, #fences do assert.is_true(tonumber(fences[i]) > tonumber(fences[i - 1])) end
    raw:close()
  end)

  it("keeps one leader at a time among five processes in an election, terms growing", function()
    helpers.loops_across(function(start_at)
      return helpers.spawn(helpers.spec_dir .. "workers/loop.lua", "redlock:" .. urls, "r:elect", 4, start_at, "elect")
    end, function() end, true, 5)
  end)

  it("tells who leads by majority, through a proclaim, with 2 of 5 servers stopped", function()
    local c, other = client({ timeout = 0.3 }), client({ timeout = 0.3 })
    local e = c:election("r:who")
    local lead = assert(e:campaign("a", 5))
    local l = assert(e:leader())
    assert.are.equal("a", l.value)
    assert.are.equal(lead.term, l.term)
    local resume = pause(1, 2)
    assert.is_true(lead:proclaim("a2"))
    l = assert(e:leader())
    assert.are.equal("a2", l.value)
    assert.are.equal(lead.term, l.term)
    local got, err = other:election("r:who"):campaign("b", 5, { wait = 0.2 })
    assert.is_nil(got)
    assert.matches("^busy: election", err)
    assert.is_true(lead:resign())
    local next_lead = assert(other:election("r:who"):campaign("b", 5))
    resume()
    assert.is_true(next_lead.term > lead.term)
    assert.are.equal("b", assert(e:leader()).value)
    assert.is_true(next_lead:resign())
    assert.is_false(e:leader())
    c:close()
    other:close()
  end)

  it("works with 2 of 5 servers stopped (SIGSTOP)", function()
    local c = client()
    local resume = pause(1, 2)
    local t0 = core.now()
    local lock, err = c:acquire("r:two", 5)
    local took = core.now() - t0
    local held = 0
    for i = 3, 5 do
      if lock and servers[i]:cli("GET", "lock:{r:two}") == lock.token then held = held + 1 end
    end
    local released, rerr
    if lock then released, rerr = lock:release() end
    resume()
    assert.is_truthy(lock, err)
    assert.is_true(took < 1, took)
    assert.are.equal(3, held)
    assert.is_true(released, rerr)
    c:close()
  end)

  it("fails, bounded, with 3 of 5 stopped, and leaves nothing held where it reached", function()
    local c = client()
    local resume = pause(1, 2, 3)
    local t0 = core.now()
    local lock, err = c:acquire("r:three", 2)
    local took = core.now() - t0
    local left = servers[4]:cli("EXISTS", "lock:{r:three}") + servers[5]:cli("EXISTS", "lock:{r:three}")
    resume()
    assert.is_nil(lock)
    assert.matches("^connection: reached 2 of 5 Redlock servers, fewer than the 3 a majority needs %(", err)
    assert.is_true(took < 1.5, took)
    assert.are.equal(0, left)
    -- The stopped ones may run the acquire when they resume: it runs out by its TTL.
    assert.is_truthy(helpers.eventually(4, function()
      for _, srv in ipairs(servers) do
        if srv:cli("EXISTS", "lock:{r:three}") ~= "0" then return false end
      end
      return true
    end))
    c:close()
  end)

  it("says busy when someone else holds the lock on 3 of 5 servers", function()
    for i = 1, 3 do assert.are.equal("OK", servers[i]:cli("SET", "lock:{r:planted}", "someone", "PX", 3000)) end
    local c = client()
    local lock, err = c:acquire("r:planted", 5)
    assert.is_nil(lock)
    assert.matches('^busy: "r:planted" is held by another owner', err)
    for i = 4, 5 do assert.are.equal("0", servers[i]:cli("EXISTS", "lock:{r:planted}")) end -- given back
    -- With wait, it is taken once the planted locks run out.
    lock = assert(c:acquire("r:planted", 5, { wait = 5 }))
    assert.is_true(lock:release())
    c:close()
  end)

  it("gives fences that grow while the majority that answers changes", function()
    local c = client()
    local last = 0
    for _, down in ipairs({ { 1, 2 }, {}, { 4, 5 }, { 2, 5 }, { 3 }, { 1, 3 }, {} }) do
      local resume = pause((table.unpack or unpack)(down)) -- luacheck: ignore (unpack: LuaJIT)
      local lock, err = c:acquire("r:fence", 5)
      local ok, rerr
      if lock then ok, rerr = lock:release() end
      resume()
      assert.is_truthy(lock, err)
      assert.is_true(ok, rerr)
      assert.is_true(lock.fence > last, lock.fence .. " after " .. last)
      last = lock.fence
    end
    -- A majority restarted (their fence records come back from the append-only
    -- files), the two others stopped: the fence still grows.
    for i = 1, 3 do servers[i]:restart() end
    assert.is_truthy(helpers.eventually(10, function()
      for i = 1, 3 do
        if not servers[i]:cli("PING"):find("PONG", 1, true) then return false end
      end
      return true
    end))
    local resume = pause(4, 5)
    local lock, err = c:acquire("r:fence", 5, { wait = 2 })
    local ok, rerr
    if lock then ok, rerr = lock:release() end
    resume()
    assert.is_truthy(lock, err)
    assert.is_true(ok, rerr)
    assert.is_true(lock.fence > last, lock.fence .. " after " .. last .. ", across restarts")
    c:close()
  end)

  it("refuses a stale holder's write-back: a newer holder's fence stays ahead", function()
    local c = client()
    -- Each server has a tenth of the TTL to answer: 100 ms, which a loaded
    -- machine meets (30 ms it did not).
    local a = assert(c:acquire("r:stale", 1, { renew = false }))
    core.sleep(1.1) -- a's lock ran out while a was "paused"
    local b = assert(c:acquire("r:stale", 5))
    assert.is_true(b.fence > a.fence)
    -- a wakes up and pushes a huge fence (years of the clock ahead): only
    -- where the lock holds its token, which is nowhere now.
    local huge = b.fence + 1000000000000
    local statuses = core.eval_many(1000, "fence_up", "r:stale", a.token, huge,
                                    (table.unpack or unpack)(c._transport.nodes)) -- luacheck: ignore
    for i = 1, 5 do assert.are_not.equal(1, statuses[i]) end
    for i = 1, 5 do
      local raw = servers[i]:raw()
      local _, last = helpers.fence_record(raw, "r:stale")
      raw:close()
      assert.is_truthy(last, "server " .. i .. " has no fence record") -- a and b took their fences there
      assert.is_true(last < huge, "server " .. i .. "'s record raised to " .. tostring(last))
    end
    assert.is_true(b:release())
    local next_lock = assert(c:acquire("r:stale", 5))
    assert.is_true(next_lock.fence > b.fence and next_lock.fence < huge, tostring(next_lock.fence))
    assert.is_true(next_lock:release())
    c:close()
  end)

  it("keeps a paused holder's fence from being accepted after a newer holder's (SIGSTOP past its validity)", function()
    local data = servers[1]
    data:cli("DEL", "resource", "writer:a", "go:a")
    local a = helpers.spawn(helpers.spec_dir .. "workers/fenced_writer.lua", "redlock:" .. urls, "r:paused", 0.5,
                            data.port, "a")
    local pid = helpers.eventually(5, function() return tonumber(data:cli("GET", "writer:a")) end)
    assert.is_truthy(pid, "the writer never took the lock")
    os.execute("kill -STOP " .. pid)
    local c = client()
    local ok, err = pcall(function()
      local b = assert(c:acquire("r:paused", 5, { wait = 3 })) -- once a's lock ran out
      assert.are.equal(1, data:raw():command("EVAL", "redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', 'b')"
                                                       .. " return 1", 1, "resource", b.fence))
      assert.is_true(b:release())
    end)
    os.execute("kill -CONT " .. pid)
    data:cli("SET", "go:a", "1")
    assert(ok, err)
    local out = a.wait()
    assert.matches("^fence %d+\nrefused", out)
    assert.are.equal("b", data:cli("HGET", "resource", "value"))
    c:close()
  end)

  it("renews on a majority while 2 servers are stopped", function()
    local c = client()
    local resume = pause(4, 5)
    local ok, err = pcall(c.with_lock, c, "r:renew", 0.6, function(lock)
      core.sleep(1.5) -- past twice the TTL: only renewals keep it
      assert.is_true(lock:check())
      return true
    end)
    resume()
    assert.is_true(ok, tostring(err))
    c:close()
  end)

  it("checks its options, and refuses what it cannot honour", function()
    local refused = helpers.new_fails
    refused({ redlock = { "redis://h:1", "redis://h:2" } }, "option 'redlock' must be a list of at least 3 servers")
    refused({ redlock = "redis://h:1" }, "option 'redlock' must be a list of at least 3 servers")
    refused({ redlock = { "redis://h:1", "redis://h:2", "http://h" } }, "option 'redlock' item 3")
    refused({ redlock = { "redis://h:1", "redis://h:2", 7 } }, "option 'redlock' item 3 must be a URL or a table")
    refused({ redlock = { "redis://h:1", "redis://h:2", {} } }, "option 'redlock' item 3 needs a host or a path")
    refused({ redlock = { "redis://h:1", "redis://h:2", { host = "h", port = 0 } } }, "item 3: port must be")
    refused({ redlock = { "redis://h:1", "redis://h:2", "redis://h:3" }, url = "redis://h" },
            "option 'url' contradicts 'redlock'")
    local c = client()
    assert.has_error(function() c:acquire("r:x", 5, { fair = true }) end,
                     "bad argument #3 to 'acquire' (option 'fair' is not available with 'redlock' (a fair queue"
                     .. " lives on one server; Redlock has no single queue to keep))")
    assert.has_error(function() c:with_lock("r:x", 5, function() end, { replicas = 1 }) end)
    local v, err = c:command("GET", "x")
    assert.is_nil(v)
    assert.matches("a Redlock client has no single server for plain commands", err)
    -- The C core's call to several servers checks its arguments too.
    local nodes = c._transport.nodes
    assert.has_error(function() core.eval_many(0, "release", "k", "t", nil, nodes[1]) end,
                     "bad argument #1 to 'eval_many' (timeout must be an integer number of milliseconds >= 1)")
    -- A take (a transaction, no script) is one connection's first try;
    -- Redlock acquires with the acquire script on every server.
    assert.has_error(function() core.eval_many(100, "take", "k", "t", 1000, nodes[1]) end,
                     "bad argument #2 to 'eval_many' (a take runs on one connection only)")
    assert.has_error(function() core.eval_many(100, "release", "k", "t", nil) end,
                     "bad argument #6 to 'eval_many' (1 to 64 clients expected)")
    assert.has_error(function() core.eval_many(100, "release", "k", "t", nil, {}) end)
    assert.has_error(function() core.eval_many(100, "fence_up", "k", "t", 0, nodes[1]) end,
                     "bad argument #5 to 'eval_many' (fence must be an integer >= 1)")
    c:close()
  end)

  -- The same behaviours under OpenResty, in a real nginx (2 workers) in
  -- front of these servers: each call goes to every server at once in
  -- light threads, and the worker's timer renews on a majority. The
  -- handlers are spec/support/ngx_app.lua's. LuaJIT pass only (nginx loads
  -- that build).
  describe("under OpenResty", function()
    if helpers.no_nginx(pending) then return end

    local nginx, raw

    lazy_setup(function()
      raw = servers[1]:raw()
      local location = helpers.location
      nginx = helpers.start_nginx({
        workers = 2,
        http = "lua_socket_log_errors off;",
        server = {
          'set $redis_redlock "' .. urls .. '";',
          'set $redis_data_url "' .. servers[1].url .. '";',
          location("/counter", "counter"),
          location("/acquire", "acquire"),
          location("/with_lock", "with_lock"),
          location("/election", "election"),
        },
      })
    end)
    lazy_teardown(function()
      if raw then raw:close() end
      if nginx then nginx:stop() end
    end)

    local function get(path)
      return http.request(nginx.port, "GET", path)
    end

    it("runs an election over cosockets: campaign, leader, proclaim, observe, resign, terms growing", function()
      nginx:elections()
    end)

    it("takes the lock on all five servers", function()
      local status, body = get("/acquire?key=o:r1&ttl=30") -- each server has a second to answer
      assert.are.equal(200, status, body .. nginx:error_log())
      local token = body:match("^%d+ (%S+)")
      for _, s in ipairs(servers) do assert.are.equal(token, s:cli("GET", "lock:{o:r1}")) end
    end)

    it("keeps 100 concurrent read-modify-writes exact under with_lock", function()
      assert.are.equal(2, nginx:counter(100, "poll", raw)) -- both workers answered
    end)

    it("takes and renews locks with 2 of 5 servers stopped", function()
      for i = 4, 5 do os.execute("kill -STOP " .. servers[i].pid) end
      local ok, err = pcall(function()
        local status, body = get("/acquire?key=o:r2&ttl=5")
        assert.are.equal(200, status, body .. nginx:error_log())
        status, body = get("/with_lock?key=o:r3&ttl=0.6&hold=1.5")
        assert.are.equal(200, status, body .. nginx:error_log())
      end)
      for i = 4, 5 do os.execute("kill -CONT " .. servers[i].pid) end
      assert(ok, err)
    end)

    it("fails with 3 of 5 stopped, saying how many it reached", function()
      for i = 3, 5 do os.execute("kill -STOP " .. servers[i].pid) end
      local status, body = get("/acquire?key=o:r4&ttl=5")
      for i = 3, 5 do os.execute("kill -CONT " .. servers[i].pid) end
      assert.are.equal(503, status)
      assert.matches("^connection: reached 2 of 5 Redlock servers", body)
    end)
  end)
end)
