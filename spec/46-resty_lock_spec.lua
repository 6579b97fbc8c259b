-- SPDX-License-Identifier: MIT
-- redislock.resty_lock: lua-resty-lock's API over Redis. In plain Lua: new
-- and configure, lock's contract (0, "locked", "timeout", the key errors),
-- unlock and expire, exptime ending a holder that never unlocks, a Redis
-- that cannot be reached, and OS processes excluded from each other. Under
-- OpenResty (LuaJIT pass): two nginx instances of two workers on one Redis,
-- each swapping the module in for resty.lock at init; the contract, a
-- read-modify-write counter that would show an overlap (within one nginx,
-- then across both), timeout, exptime, and a small cache written against
-- resty.lock whose callbacks never overlap across the two instances.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")

-- A fresh copy of the module: nothing configured.
local function fresh()
  package.loaded["redislock.resty_lock"] = nil
  return require("redislock.resty_lock")
end

describe("redislock.resty_lock", function()
  local srv, raw
  helpers.redis_for(function(s, r) srv, raw = s, r end, { flush = true })

  describe("in plain Lua", function()
    local rl
    before_each(function() rl = fresh() end)

    it("answers new without Redis configured, then with configure's client or opts.client", function()
      local lock, err = rl:new("locks")
      assert.is_nil(lock)
      assert.are.equal('no Redis configured: call require("redislock.resty_lock").configure(client or options) in '
                       .. "init_by_lua or init_worker_by_lua, or pass opts.client", err)
      -- opts.client alone will do
      local own = srv:client()
      lock = assert(rl:new("locks", { client = own }))
      assert.are.equal(own, lock.client)
      -- configure with options, a URL, or a client
      local c = rl.configure({ port = srv.port })
      assert.are.equal(c, assert(rl:new("locks")).client)
      assert.are.equal(own, assert(rl:new("locks", { client = own })).client) -- opts.client wins
      assert.are_not.equal(c, rl.configure(srv.url))
      assert.are.equal(own, rl.configure(own))
      -- the '.' form is taken too, and an object's new makes another
      lock = assert(rl.new("locks", { timeout = 1 }))
      assert.are.equal(1, lock.timeout)
      assert.are.equal(0, lock:new("other"):lock("k"))
    end)

    it("answers bad input as lua-resty-lock does, and raises on options of the wrong type", function()
      rl.configure(srv:client())
      for _, name in ipairs({ "", 5, false }) do
        local lock, err = rl:new(name)
        assert.is_nil(lock)
        assert.are.equal("dictionary not found", err)
      end
      assert.are.equal("dictionary not found", select(2, rl:new()))
      -- a name no lock's name may begin with ("}": an empty hash tag) is refused here, not by lock
      assert.are.same({ nil, "dictionary not found" }, { rl:new("}locks") })
      assert.are.same({ nil, "dictionary not found" }, { rl.new("}") })
      -- lua-resty-lock's defaults, its timeout capped by exptime and step by the timeout
      local lock = assert(rl:new("locks", { unknown = true })) -- other options are ignored, as there
      assert.are.same({ 30, 5, 0.001, 2, 0.5 }, { lock.exptime, lock.timeout, lock.step, lock.ratio, lock.max_step })
      lock = assert(rl:new("locks", { exptime = 2, timeout = 9, step = 3 }))
      assert.are.same({ 2, 2, 2 }, { lock.exptime, lock.timeout, lock.step })
      assert.has_error(function() rl:new("locks", "fast") end,
                       "bad argument #2 to 'new' (options must be a table, got string)")
      assert.has_error(function() rl:new("locks", { exptime = "1" }) end,
                       "bad argument #2 to 'new' (option 'exptime' must be a number, got string)")
      assert.has_error(function() rl:new("locks", { timeout = 0 / 0 }) end,
                       "bad argument #2 to 'new' (option 'timeout' must be a number, got NaN)")
      assert.has_error(function() rl:new("locks", { exptime = 0 }) end,
                       "bad argument #2 to 'new' (option 'exptime' must be > 0)")
      assert.has_error(function() rl:new("locks", { client = {} }) end,
                       "bad argument #2 to 'new' (option 'client' must be a redislock client, got table)")
      assert.has_error(function() rl.configure(6379) end, "bad argument #1 to 'configure' (a redislock client "
                                                          .. "or redislock.new's options expected, got number)")
      assert.has_error(function() rl.configure({ prot = 1 }) end,
                       "bad argument #1 to 'configure' (unknown option \"prot\")")
      assert.has_error(function() rl.lock({}, "k") end)
      -- the key's errors are answers, as lua-resty-lock's shared dictionary gives them
      lock = assert(rl:new("locks"))
      assert.are.same({ nil, "nil key" }, { lock:lock(nil) })
      assert.are.same({ nil, "empty key" }, { lock:lock("") })
      assert.are.same({ nil, "key too long" }, { lock:lock(("k"):rep(65536)) })
      assert.are.equal(0, lock:lock(42)) -- made a string
      assert.are.equal("42", lock.key)
      assert.has_error(function() lock:expire(-1) end, "bad argument #1 to 'expire' (time must be > 0)")
      assert.are.equal(1, lock:unlock())
    end)

    it("keeps lock's contract: 0 at once, locked, timeout, unlock's 1 and unlocked, expire", function()
      rl.configure(srv:client())
      local a = assert(rl:new("locks", { exptime = 5 }))
      assert.are.equal(0, a:lock("k"))
      assert.are.equal(1, raw:command("EXISTS", "lock:{locks:k}"))
      assert.are.same({ nil, "locked" }, { a:lock("other") })
      -- another object: timeout 0 tries once; a timeout waits it out
      assert.are.same({ nil, "timeout" }, { assert(rl:new("locks", { timeout = 0 })):lock("k") })
      local began = core.now()
      assert.are.same({ nil, "timeout" }, { assert(rl:new("locks", { timeout = 0.3 })):lock("k") })
      local took = core.now() - began
      assert.is_true(took >= 0.29 and took < 1.3 * helpers.slow, took .. " s")
      -- another dictionary is another lock
      assert.are.equal(0, assert(rl:new("other")):lock("k"))
      -- expire: a time, or exptime again
      assert.is_true(a:expire(9))
      assert.is_true(raw:command("PTTL", "lock:{locks:k}") > 8000)
      assert.is_true(a:expire())
      assert.is_true(raw:command("PTTL", "lock:{locks:k}") <= 5000)
      assert.is_number(a.held.fence)
      assert.are.equal(1, a:unlock())
      assert.are.equal(0, raw:command("EXISTS", "lock:{locks:k}"))
      assert.are.same({ nil, "unlocked" }, { a:unlock() })
      assert.are.same({ nil, "unlocked" }, { a:expire() })
      assert.is_nil(a.held)
      assert.are.equal(0, a:lock("k")) -- the object is free to lock again
      assert.are.equal(1, a:unlock())
    end)

    it("lets exptime end a holder that never unlocks; the waiter says it waited; the holder hears lost", function()
      rl.configure(srv:client())
      local holder = assert(rl:new("locks", { exptime = 0.4 }))
      assert.are.equal(0, holder:lock("e"))
      local began = core.now()
      local elapsed = assert(assert(rl:new("locks", { timeout = 5 })):lock("e"))
      local took = core.now() - began
      assert.is_true(elapsed >= 0.3 and elapsed <= took, elapsed .. " s waited, " .. took .. " s taken")
      assert.is_true(took < 2 * helpers.slow, took .. " s")
      local ok, err = holder:unlock()
      assert.is_nil(ok)
      assert.matches('^lost: "locks:e" is no longer ours', err)
      assert.are.same({ nil, "unlocked" }, { holder:unlock() })
    end)

    it("says when Redis cannot be reached, within the timeout", function()
      rl.configure({ port = helpers.free_port() })
      local lock = assert(rl:new("locks", { timeout = 0 }))
      local began = core.now()
      local ok, err = lock:lock("k")
      assert.is_nil(ok)
      assert.matches("^connection: cannot connect to 127%.0%.0%.1:%d+ %(Connection refused%)", err)
      assert.is_true(core.now() - began < 0.5 * helpers.slow)
      -- with a timeout, it tries again until the timeout, not past it
      lock = assert(rl:new("locks", { timeout = 0.5 }))
      began = core.now()
      ok, err = lock:lock("k")
      local took = core.now() - began
      assert.is_nil(ok)
      assert.matches("^connection: cannot connect", err)
      assert.is_true(took >= 0.45 and took < 1.5 * helpers.slow, took .. " s")
    end)

    it("keeps 4 processes out of each other's read-modify-writes (lock and unlock around them)", function()
      assert.are.equal("OK", raw:command("SET", "counter", "0"))
      local start_at, procs = core.now() + 0.5 * helpers.slow, {}
      for i = 1, 4 do
        procs[i] = helpers.spawn(helpers.spec_dir .. "workers/counter.lua", srv.port, "resty", 30, start_at)
      end
      assert.are.equal(0, helpers.overlaps(procs))
      assert.are.equal("120", raw:command("GET", "counter"))
      local fences = raw:command("LRANGE", "fences", 0, -1)
      for i = 2, #fences do assert.is_true(tonumber(fences[i]) > tonumber(fences[i - 1])) end
    end)
  end)

  describe("under OpenResty", function()
    if helpers.no_nginx(pending) then return end

    -- Two nginx of two workers on srv. Both swap the module in for
    -- resty.lock; a configures it in init_by_lua (with options), b in
    -- init_worker_by_lua (with a client).
    local a, b
    local function start(instance, phase, x)
      return helpers.start_nginx({
        workers = 2,
        http = table.concat({
          "lua_socket_log_errors off;",
          "lua_shared_dict cache 1m;",
          "lua_shared_dict locks 100k;", -- what lua-resty-lock needs; unused here
          phase .. " {",
          '  package.loaded["resty.lock"] = require("redislock.resty_lock")',
          '  require("redislock.resty_lock").configure(' .. x .. ")",
          "}",
          "server {",
          "  listen 127.0.0.1:{{port}} reuseport;",
          "  set $instance " .. instance .. ";",
          '  set $dead_url "redis://127.0.0.1:' .. helpers.free_port() .. '";',
          "  location / { content_by_lua_block {",
          '    require("spec.support.ngx_resty_lock")[ngx.var.uri:sub(2)]() } }',
          "}",
        }, "\n"),
      })
    end
    lazy_setup(function()
      a = start("a", "init_by_lua_block", '{ url = "redis://127.0.0.1:' .. srv.port .. '" }')
      b = start("b", "init_worker_by_lua_block", 'require("redislock").new{ port = ' .. srv.port .. " }")
    end)
    lazy_teardown(function()
      if a then a:stop() end
      if b then b:stop() end
    end)

    -- Sends every request of list ({ nginx, path }) at once; returns the
    -- responses in order ({ status, body, headers }).
    local function all(list)
      local started = {}
      for i, r in ipairs(list) do started[i] = http.start(r[1].port, "GET", r[2], { timeout = 60 * helpers.slow }) end
      local out = {}
      for i, p in ipairs(started) do
        local status, body, headers = p:finish()
        out[i] = { status = status, body = body, headers = headers }
      end
      return out
    end

    it("keeps lock's contract in each nginx", function()
      for _, n in ipairs({ a, b }) do
        local status, body = http.request(n.port, "GET", "/contract?key=c")
        assert.are.equal(200, status, body .. n:error_log())
        assert.are.equal(table.concat({ "0", "nil locked", "true", "true", "true", "true", "1", "nil unlocked",
                                        "nil unlocked", "nil nil key", "nil empty key" }, "\n") .. "\n", body)
      end
    end)

    -- n sections of the counter k (more: the query's rest), spread over
    -- the nginx of list, at once; returns the final counter, the overlaps
    -- seen and the worker PIDs that served them (pid -> true).
    local function counter_run(list, n, k, more)
      local reqs = {}
      for i = 1, n do reqs[i] = { list[i % #list + 1], "/section?key=" .. k .. "&timeout=30" .. (more or "") } end
      local workers = {}
      for i, r in ipairs(all(reqs)) do
        assert.are.equal(200, r.status, "request " .. i .. ": " .. r.body .. list[1]:error_log())
        workers[r.headers["x-worker"]] = true
      end
      return tonumber(raw:command("GET", "counter:" .. k)), tonumber(raw:command("GET", "overlaps:" .. k) or "0"),
             workers
    end

    it("loses updates without the lock, in one nginx and across two (the race is real)", function()
      local count, overlaps = counter_run({ a }, 30, "racy", "&nolock=1&hold=0.01")
      assert.is_true(count < 30 and overlaps > 0, count .. " updates, " .. overlaps .. " overlaps")
      count, overlaps = counter_run({ a, b }, 30, "racy2", "&nolock=1&hold=0.01")
      assert.is_true(count < 30 and overlaps > 0, count .. " updates, " .. overlaps .. " overlaps")
    end)

    it("excludes the two workers of one nginx, then both nginx on one Redis", function()
      local count, overlaps, workers = counter_run({ a }, 40, "one", "&hold=0.005")
      assert.are.equal(40, count)
      assert.are.equal(0, overlaps)
      local served = 0
      for _ in pairs(workers) do served = served + 1 end
      assert.are.equal(2, served)
      count, overlaps, workers = counter_run({ a, b }, 60, "two", "&hold=0.005")
      assert.are.equal(60, count)
      assert.are.equal(0, overlaps)
      served = 0
      for _ in pairs(workers) do served = served + 1 end
      assert.are.equal(4, served)
    end)

    it("times out on a lock another nginx holds, and a waiter blocked on Redis gets it at its release", function()
      local holding = http.start(a.port, "GET", "/section?key=t&hold=3")
      assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{locks:t}") == 1 end))
      local status, body = http.request(b.port, "GET", "/section?key=t&timeout=0")
      assert.are.same({ 409, "timeout\n" }, { status, body })
      local began = core.now()
      status, body = http.request(b.port, "GET", "/section?key=t&timeout=0.3")
      local took = core.now() - began
      assert.are.same({ 409, "timeout\n" }, { status, body })
      assert.is_true(took >= 0.29 and took < 1.2 * helpers.slow, took .. " s")
      -- A waiter with time left blocks on Redis (no sleep loop) until the release.
      local waiting = http.start(b.port, "GET", "/section?key=t&timeout=10")
      assert.is_truthy(helpers.eventually(5, function() return helpers.blocked(raw) == 1 end))
      assert.are.equal(200, (holding:finish()))
      status, body = waiting:finish()
      assert.are.equal(200, status, body)
      local elapsed = tonumber(body:match("^(%S+)"))
      assert.is_true(elapsed > 0 and elapsed < 3.5, body)
    end)

    it("lets exptime end a lock whose request ended without unlocking", function()
      local status, body = http.request(a.port, "GET", "/keep?key=e&exptime=0.6")
      assert.are.equal(200, status, body)
      local pttl = raw:command("PTTL", "lock:{locks:e}")
      assert.is_true(pttl > 0 and pttl <= 600, "PTTL " .. pttl)
      local began = core.now()
      status, body = http.request(b.port, "GET", "/section?key=e&timeout=5")
      local took = core.now() - began
      assert.are.equal(200, status, body)
      local elapsed, fence = body:match("^(%S+) (%d+)")
      assert.is_true(tonumber(elapsed) > 0.3 and took < 3 * helpers.slow, body .. " in " .. took .. " s")
      assert.is_true(tonumber(fence) > 0)
    end)

    it("says when opts.client's Redis cannot be reached, within the timeout", function()
      local began = core.now()
      local status, body = http.request(b.port, "GET", "/dead?timeout=0.5")
      local took = core.now() - began
      assert.are.equal(503, status, body)
      assert.matches("^%S+ connection: cannot connect to 127%.0%.0%.1:%d+", body)
      assert.is_true(took >= 0.45 and took < 2 * helpers.slow, took .. " s")
    end)

    describe("swapped in for resty.lock under a cache written against it", function()
      -- 20 requests for one key to each nginx at once: every callback
      -- holds for hold seconds; returns the responses, the callbacks'
      -- overlaps and their spans ({ instance, enter, leave }).
      local function crowd(key, dict_a, dict_b, hold)
        local reqs = {}
        for i = 1, 40 do
          local n, dict = i % 2 == 0 and a or b, i % 2 == 0 and dict_a or dict_b
          reqs[i] = { n, "/cached?key=" .. key .. "&ttl=2&hold=" .. hold .. "&dict=" .. dict }
        end
        local out = all(reqs)
        local spans = {}
        for _, s in ipairs(raw:command("LRANGE", "cb_spans:" .. key, 0, -1)) do
          local who, enter, leave = s:match("^(%a) (%S+) (%S+)$")
          spans[#spans + 1] = { who = who, enter = tonumber(enter), leave = tonumber(leave) }
        end
        table.sort(spans, function(x, y) return x.enter < y.enter end)
        return out, tonumber(raw:command("GET", "cb_overlaps:" .. key) or "0"), spans
      end

      it("runs the callbacks of the two nginx one at a time", function()
        local out, overlaps, spans = crowd("shared", "locks", "locks", 0.05)
        for i, r in ipairs(out) do assert.are.equal(200, r.status, "request " .. i .. ": " .. r.body) end
        assert.are.equal(0, overlaps)
        local seen = {}
        for i, s in ipairs(spans) do
          seen[s.who] = true
          if i > 1 then assert.is_true(s.enter >= spans[i - 1].leave, "callbacks overlap") end
        end
        assert.are.same({ a = true, b = true }, seen) -- each nginx ran its own miss's callback
      end)

      it("overlaps them across the nginx when each locks in a namespace of its own (a shared dictionary)", function()
        local out, overlaps = crowd("apart", "locks_a", "locks_b", 0.5)
        for i, r in ipairs(out) do assert.are.equal(200, r.status, "request " .. i .. ": " .. r.body) end
        assert.is_true(overlaps > 0)
      end)
    end)
  end)
end)
