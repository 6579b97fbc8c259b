-- SPDX-License-Identifier: MIT
-- Mutual exclusion across OS processes: 8 workers increment a shared Redis
-- counter by read-modify-write. With with_lock (waiting by notification, by
-- polling, or in a fair queue) no update is lost and no two
-- workers are ever inside at once; without it, updates are lost (so this spec
-- would fail if the lock did not exclude).
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")

local WORKERS, ROUNDS = 8, 40

describe("mutual exclusion across processes", function()
  local srv, raw

  helpers.redis_for(function(s, r) srv, raw = s, r end)

  -- Runs the workers in `mode`; returns the final counter and the overlaps seen.
  local function race(mode)
    assert.are.equal("OK", raw:command("FLUSHALL"))
    assert.are.equal("OK", raw:command("SET", "counter", "0"))
    local start_at = core.now() + 0.5 * helpers.slow
    local procs = {}
    for i = 1, WORKERS do
      procs[i] = helpers.spawn(helpers.spec_dir .. "workers/counter.lua", srv.port, mode, ROUNDS, start_at)
    end
    local overlaps = helpers.overlaps(procs)
    return tonumber(raw:command("GET", "counter")), overlaps
  end

  it("loses updates without the lock (the race is real)", function()
    local counter, overlaps = race("nolock")
    assert.is_true(counter < WORKERS * ROUNDS, "counter " .. counter)
    assert.is_true(overlaps > 0)
  end)

  for _, mode in ipairs({ "notify", "poll", "fair" }) do
    it("loses none with with_lock (" .. mode .. "), and no two workers are ever inside at once", function()
      local counter, overlaps = race(mode)
      assert.are.equal(WORKERS * ROUNDS, counter)
      assert.are.equal(0, overlaps)
      -- Every section had a fence of its own, larger than the one before.
      local fences = raw:command("LRANGE", "fences", 0, -1)
      assert.are.equal(WORKERS * ROUNDS, #fences)
      for i = 2, #fences do
        local a, b = tonumber(fences[i - 1]), tonumber(fences[i])
        assert.is_true(b > a, "fence " .. b .. " after " .. a)
      end
      assert.are.equal(0, raw:command("EXISTS", "lock:{counter}"))
    end)
  end

  -- The same under OpenResty: a real nginx with the lua module, 200
  -- concurrent requests over cosockets and nginx's connection pool, waiting
  -- that does not block the worker. The handlers are
  -- spec/support/ngx_app.lua's. LuaJIT pass only (nginx loads that build).
  describe("under OpenResty", function()
    if helpers.no_nginx(pending) then return end
    before_each(function() assert.are.equal("OK", raw:command("FLUSHALL")) end)

  -- n concurrent GETs of path; returns the responses.
  local function burst(ngx, n, path)
    local reqs = {}
    for i = 1, n do reqs[i] = path end
    return http.parallel(ngx.port, reqs, { timeout = 120 * helpers.slow })
  end

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
        local ngx = helpers.app_nginx_for(function() return srv end, workers)

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
        if workers == 1 then
          it("tells a lock another request of the worker holds from one this request holds", function()
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
          end)
        end

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
  end)
end)
