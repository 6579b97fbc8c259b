-- SPDX-License-Identifier: MIT
-- Lease safety: the watchdog renews a lock while fn computes, a lease lost
-- while the holder was stopped is reported (check, with_lock, on_lost) with
-- fences that show the order, renewal survives CLIENT KILL, max_hold ends it,
-- a collected lock is not renewed, and replicas acknowledge (WAIT) or the
-- lock is given back. Several specs run the watchdog in this process, so
-- `make valgrind` and `make asan` check the thread too.
local core = require("redislock.core")
local helpers = require("spec.helpers")

describe("leases", function()
  local srv, raw, client
  local stopped -- the PID of a process a spec sent SIGSTOP, until it sends SIGCONT

  helpers.client_each(function(s, r, c) srv, raw, client = s, r, c end)
  after_each(function()
    -- A spec that failed between SIGSTOP and SIGCONT must not leave its
    -- worker stopped (the suite would wait for it for ever).
    if stopped then helpers.sh_ok("kill -CONT " .. stopped .. " 2>/dev/null") end
    stopped = nil
  end)

  local function worker(key, ttl, seconds)
    return helpers.spawn(helpers.spec_dir .. "workers/lease.lua", srv.port, key, ttl, seconds)
  end

  -- Computes for `seconds` with no Redis calls (core.now() only reads the clock).
  local function compute(seconds)
    local stop, n = core.now() + seconds * helpers.slow, 0
    while core.now() < stop do n = n + 1 end
    return n
  end

  describe("in a worker process", function()
    it("stay held while fn computes for 3 TTLs, and are released at the end", function()
      local proc = worker("cpu", 0.5, 1.5)
      assert.is_truthy(helpers.eventually(5, function() return raw:command("LLEN", "holders") == 1 end))
      local fence = raw:command("LINDEX", "holders", 0):match("^%d+ (%d+)$")
      -- Another owner keeps finding it busy for two TTLs of 0.5 s (the work
      -- takes 1.5 s; stopping at 1 s leaves the worker's own release out).
      local other = srv:client()
      local stop = core.now() + 1
      repeat
        local lock, err = other:acquire("cpu", 5)
        assert.is_nil(lock, "another owner took a renewed lock")
        assert.is_truthy(err:match("^busy: "), err)
        core.sleep(0.02)
      until core.now() >= stop
      local out, ok = proc.wait()
      assert.is_true(ok, out)
      assert.is_truthy(out:find("check: true nil", 1, true), out)
      assert.is_truthy(out:find("done " .. fence .. "\n", 1, true), out) -- held with its first fence to the end
      assert.are.equal(0, raw:command("EXISTS", "lock:{cpu}"))
      other:close()
    end)

    it("learn that a lease was lost while the holder was stopped (SIGSTOP), and the fences show it", function()
      local proc = worker("paused", 0.5, 3)
      assert.is_truthy(helpers.eventually(5, function() return raw:command("LLEN", "holders") == 1 end))
      local pid, fence = raw:command("LINDEX", "holders", 0):match("^(%d+) (%d+)$")
      assert.is_true(helpers.sh_ok("kill -STOP " .. pid))
      stopped = pid
      -- Stopped, it renews nothing: the lock expires and another owner takes it.
      local other = srv:client()
      local theirs = helpers.eventually(5, function() return other:acquire("paused", 30) end)
      assert.is_truthy(theirs, "the lock of a stopped holder never expired")
      assert.is_true(helpers.sh_ok("kill -CONT " .. pid))
      stopped = nil
      local out, ok = proc.wait()
      assert.is_true(ok, out)
      assert.is_truthy(out:find('check: nil lost: "paused" is no longer ours (another owner holds it now',
                                1, true), out)
      assert.is_truthy(out:find('raised lost: "paused" is no longer ours', 1, true), out)
      assert.is_true(theirs.fence > tonumber(fence), theirs.fence .. " after " .. fence)
      assert.are.equal(theirs.token, raw:command("GET", "lock:{paused}"))
      other:close()
    end)

    it("keep renewing after CLIENT KILL of every connection", function()
      local proc = worker("killed", 0.6, 4)
      assert.is_truthy(helpers.eventually(5, function() return raw:command("LLEN", "holders") == 1 end))
      local fence = raw:command("LINDEX", "holders", 0):match("^%d+ (%d+)$")
      local other = srv:client()
      for _ = 1, 4 do -- 1.2 s of the worker's 4, two TTLs
        -- raw's own connection is spared (SKIPME); the worker's and the
        -- watchdog's are cut.
        assert(raw:command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
        core.sleep(0.3)
        local lock = other:acquire("killed", 5)
        assert.is_nil(lock, "another owner took the lock after CLIENT KILL")
      end
      local out, ok = proc.wait()
      assert.is_true(ok, out)
      assert.is_truthy(out:find("done " .. fence .. "\n", 1, true), out)
      other:close()
    end)
  end)

  describe("in this process", function()
    -- Under valgrind one thread runs at a time: times are widened.
    local slow = helpers.slow

    it("renew while Lua computes, and stop at release", function()
      local lock = assert(client:acquire("here", 0.3 * slow, { renew = true }))
      compute(1)
      assert.is_true(lock:check())
      assert.is_true(lock:check(true))
      local pttl = raw:command("PTTL", "lock:{here}")
      assert.is_true(pttl > 0 and pttl <= 300 * slow, tostring(pttl))
      assert.is_true(lock:release())
      -- Were it still renewed, a key put back with its token would live on.
      assert.are.equal("OK", raw:command("SET", "lock:{here}", lock.token, "PX", 300 * slow))
      assert.is_truthy(helpers.eventually(2, function() return raw:command("EXISTS", "lock:{here}") == 0 end))
    end)

    it("are no longer renewed once their client is closed", function()
      local c = srv:client()
      local lock = assert(c:acquire("closing", 0.3 * slow, { renew = true }))
      c:close()
      assert.is_truthy(helpers.eventually(2, function() return raw:command("EXISTS", "lock:{closing}") == 0 end))
      assert.is_nil((lock:check()))
    end)

    it("report a lock deleted under them as lost, once, through on_lost", function()
      local calls = {}
      local lock = assert(client:acquire("gone", 0.3 * slow, {
        renew = true, on_lost = function(l, err) calls[#calls + 1] = { l, err } end,
      }))
      assert.are.equal(1, raw:command("DEL", "lock:{gone}"))
      assert.is_truthy(helpers.eventually(2, function() return not lock:check() end))
      local _, err = lock:check()
      assert.is_truthy(
        err:match('^lost: "gone" is no longer ours %(it expired or was deleted; found by the watchdog%)'), err)
      assert.are.equal(1, #calls)
      assert.are.equal(lock, calls[1][1])
      assert.are.equal(err, calls[1][2])
      local ok, rerr = lock:release()
      assert.is_nil(ok)
      assert.are.equal(err, rerr)
      local _, eerr = lock:extend(5)
      assert.are.equal(err, eerr)
      assert.are.equal(1, #calls)
    end)

    -- LuaJIT runs no debug hooks in compiled code (the loop below compiles).
    local it_hooks = jit and pending or it
    it_hooks("let on_lost abort with_lock's fn early (LuaJIT: only from interpreted code)", function()
      local finished = false
      local ok, err = pcall(client.with_lock, client, "abort", 0.3 * slow, function()
        assert.are.equal(1, raw:command("DEL", "lock:{abort}"))
        compute(3)
        finished = true
      end, { on_lost = function(_, why) error("aborted: " .. why, 0) end })
      assert.is_false(ok)
      assert.is_truthy(tostring(err):match('^aborted: lost: "abort" is no longer ours'), tostring(err))
      assert.is_false(finished)
    end)

    -- The issue's case: on_lost aborts fn while fn takes and releases other
    -- locks in a loop; the abort may strike inside acquire, or between its
    -- return and the variable that releases the lock. No lock may be left.
    -- LuaJIT: the loop runs interpreted (jit.off), or no hook would fire.
    local function abort_while_taking(body)
      local c = srv:client()
      local fn = assert(load(body, "=abort-loop"))(c)
      if jit then jit.off(fn, true) end
      local aborted = 0
      for run = 1, 30 do
        local ok, err = pcall(c.with_lock, c, "outer", 0.06 * slow, fn,
                              { on_lost = function() error("aborted", 0) end })
        assert.is_false(ok, "fn was not aborted")
        if err == "aborted" then aborted = aborted + 1 end
        assert.are.equal(0, raw:command("EXISTS", "lock:{inner}"),
                         "run " .. run .. " left lock:{inner}: " .. tostring(err))
        raw:command("DEL", "lock:{outer}")
      end
      assert.is_true(aborted >= 25, aborted .. " of 30 runs aborted")
      c:close()
    end

    it("never strand a lock fn was taking when on_lost aborts fn (plain locals)", function()
      abort_while_taking([[
        local c = ...
        return function()
          c:command("DEL", "lock:{outer}")
          for _ = 1, 1000000 do
            local l = c:acquire("inner", 60)
            l:release()
          end
        end
      ]])
    end)

    if _VERSION ~= "Lua 5.1" then
      it("never strand a lock fn was taking when on_lost aborts fn (<close> variables)", function()
        abort_while_taking([[
          local c = ...
          return function()
            c:command("DEL", "lock:{outer}")
            for _ = 1, 1000000 do local l <close> = c:acquire("inner", 60) end
          end
        ]])
      end)
    end

    it("do not pile up what they note of the locks fn takes and releases while on_lost watches", function()
      local c = srv:client()
      collectgarbage()
      collectgarbage()
      local before, grown = collectgarbage("count"), nil
      c:with_lock("outer", 30, function()
        for _ = 1, 20000 do assert(c:acquire("inner", 5)):release() end
        collectgarbage()
        collectgarbage()
        grown = collectgarbage("count") - before
      end, { on_lost = function() end })
      -- A note for each of the 20,000 locks would be several MiB.
      assert.is_true(grown < 512, string.format("grew by %.0f KiB", grown))
      c:close()
    end)

    it("keep a lock fn took and kept outside fn when on_lost aborts fn", function()
      local c = srv:client()
      local kept
      local ok, err = pcall(c.with_lock, c, "outer", 0.06 * slow, function()
        kept = c:acquire("kept", 60)
        raw:command("DEL", "lock:{outer}")
        compute(3)
      end, { on_lost = function() error("aborted", 0) end })
      assert.is_false(ok)
      if not jit then assert.are.equal("aborted", err) end
      assert.are.equal(kept.token, raw:command("GET", "lock:{kept}"))
      assert.is_true(kept:release())
      c:close()
    end)

    it("leave a debug hook that fn set for itself in place", function()
      local mine = function() end
      client:with_lock("hooked", 5, function()
        debug.sethook(mine, "", 1000000)
      end, { on_lost = function() end })
      assert.are.equal(mine, (debug.gethook()))
      debug.sethook()
    end)

    it("stop renewing after max_hold, and the lease runs out", function()
      local lock = assert(client:acquire("capped", 0.3 * slow, { renew = true, max_hold = 0.4 * slow }))
      assert.is_truthy(helpers.eventually(3, function() return raw:command("EXISTS", "lock:{capped}") == 0 end))
      local ok, err = lock:check(true)
      assert.is_nil(ok)
      assert.is_truthy(err:match('^lost: "capped" is no longer ours %(its TTL ran out%)'), err)
    end)

    it("are not renewed once the lock was garbage-collected", function()
      assert(client:acquire("dropped", 0.3 * slow, { renew = true }))
      collectgarbage()
      collectgarbage()
      assert.is_truthy(helpers.eventually(3, function() return raw:command("EXISTS", "lock:{dropped}") == 0 end))
    end)

    it("are not renewed once a coroutine dropped inside with_lock was collected", function()
      local co = coroutine.create(function()
        client:with_lock("dropped-co", 0.3 * slow, function() coroutine.yield() end)
      end)
      assert.is_true((coroutine.resume(co)))
      assert.are.equal(1, raw:command("EXISTS", "lock:{dropped-co}"))
      co = nil -- luacheck: ignore (dropped on purpose)
      collectgarbage()
      collectgarbage()
      assert.is_truthy(helpers.eventually(3, function() return raw:command("EXISTS", "lock:{dropped-co}") == 0 end))
    end)

    it("are not taken without renew, and check() says when the TTL has run out", function()
      local lock = assert(client:acquire("plain", 0.2 * slow))
      core.sleep(0.3 * slow)
      local ok, err = lock:check()
      assert.is_nil(ok)
      assert.is_truthy(err:match('^lost: "plain" is no longer ours %(its TTL ran out%)'), err)
    end)
  end)

  describe("with a replica", function()
    local replica

    lazy_setup(function()
      replica = helpers.start_redis({ "--replicaof", "127.0.0.1", tostring(srv.port) })
      assert.is_truthy(helpers.eventually(10, function()
        return replica:cli("INFO", "replication"):find("master_link_status:up", 1, true)
      end), "the replica never connected")
    end)
    lazy_teardown(function()
      if replica then
        helpers.sh_ok("kill -CONT " .. replica.pid .. " 2>/dev/null")
        replica:stop()
      end
    end)

    it("acquire when the replica acknowledges, and give the lock back when it does not", function()
      local lock = assert(client:acquire("durable", 5, { replicas = 1, replica_timeout = 2 }))
      assert.is_truthy(helpers.eventually(2, function()
        return replica:cli("GET", "lock:{durable}") == lock.token
      end))
      assert.is_true(helpers.sh_ok("kill -STOP " .. replica.pid))
      local none, err = client:acquire("flaky", 5, { replicas = 1, replica_timeout = 0.3 })
      assert.is_true(helpers.sh_ok("kill -CONT " .. replica.pid))
      assert.is_nil(none)
      assert.is_truthy(err:match('^redis: "flaky" reached 0 of 1 replica within 0%.3 s %(WAIT%), so it was released$'),
                       err)
      assert.are.equal(0, raw:command("EXISTS", "lock:{flaky}"))
    end)
  end)
end)
