-- SPDX-License-Identifier: MIT
-- Waiting for a busy lock, across OS processes (spec/workers/waiter.lua):
-- release wakes exactly one waiter (no herd, no polling), a lock that expires
-- is taken within its TTL, polling still works, and a fair lock serves its
-- waiters in arrival order even when one of them dies. Nothing here is timed:
-- the proofs are counts the server keeps (blocked clients, scripts run) and
-- the order in which the waiters got the lock.
local core = require("redislock.core")
local helpers = require("spec.helpers")

describe("waiting", function()
  local srv, raw, holder

  helpers.client_each(function(s, r, c)
    srv, raw, holder = s, r, c
    helpers.warm(holder, raw)
  end)

  -- Clients blocked in the server right now (waiters in BLPOP).
  local function blocked() return helpers.blocked(raw) end

  -- Lock scripts the server has run since the last CONFIG RESETSTAT.
  local function scripts_run() return helpers.scripts_run(raw) end

  -- Starts a waiter process: waiter(key, wait, mode, kind, hold, tag).
  local function waiter(key, wait, mode, kind, hold, tag)
    return helpers.spawn(helpers.spec_dir .. "workers/waiter.lua", srv.port, key, wait, mode, kind, hold, tag)
  end

  -- Waits for every process; returns their outputs, checking they succeeded.
  local function finish(procs)
    local outs = {}
    for i, p in ipairs(procs) do
      local out, ok = p.wait()
      assert.is_true(ok, "waiter " .. i .. ": " .. out)
      outs[i] = out
    end
    return outs
  end

  describe("with notification (the default)", function()
    it("wakes exactly one waiter per release, and the waiters try once each", function()
      local lock = assert(holder:acquire("k", 30))
      local before = scripts_run()
      local procs = {}
      -- Each holds the lock 1 s: time enough to look at the others.
      for i = 1, 3 do procs[i] = waiter("k", 20, "notify", "plain", 1, "w" .. i) end
      assert.is_truthy(helpers.eventually(5, function() return blocked() == 3 end), "the waiters never blocked")
      assert.is_true(lock:release())
      -- One waiter woke and holds the lock; the other two still block.
      assert.is_truthy(helpers.eventually(5, function() return raw:command("LLEN", "order") == 1 end))
      assert.are.equal(2, blocked())
      for _, out in ipairs(finish(procs)) do assert.is_truthy(out:match("^got w%d"), out) end
      assert.are.equal(3, raw:command("LLEN", "order"))
      -- The holder's release, then per waiter: its first try (a take, no
      -- script, then the acquire script, as the lock is held),
      -- one try that registers it before blocking, one more each second it
      -- waits (it blocks 1 s at most: its registration lasts 3 s), and its
      -- release; none after its wake-up: the release handed it the lock.
      -- The three wait about 0, 1 and 2 s. Polling would have tried again
      -- and again while it waited. A release that finds the waiters mark
      -- sends its script twice (the second time with the names of its
      -- wake-up): each waiter's; the holder's too, unless its last release
      -- of the key found somebody waiting (then it sends all at once).
      local runs = scripts_run() - before
      assert.is_true(runs >= 1 + 3 * 4 + 1 and runs <= 2 + 3 * 4 + 4, "scripts run: " .. runs)
      assert.are.equal(0, blocked())
    end)

    it("takes a lock that expires without a release, blocking rather than polling meanwhile", function()
      assert(holder:acquire("k", 1.5))
      local before = scripts_run()
      local out = finish({ waiter("k", 10, "notify", "plain", 0, "late") })[1]
      assert.is_truthy(out:match("^got late"), out)
      assert.are.equal(0, raw:command("EXISTS", "lock:{k}"))
      -- A try, a try that registers, blocks of 1 s at most (each followed
      -- by a try) until 0.1 s before the TTL ends, a few short tries near
      -- the end (polling over 1.5 s would take about 17), the release
      -- (twice: it finds the waiters mark its own try set). A slow run
      -- (ASan) adds a short try or two.
      assert.is_true(scripts_run() - before <= 13, "scripts run: " .. (scripts_run() - before))
    end)

    it("costs nothing to wake when nobody waits, and wakes once somebody tried", function()
      -- Calls per command the server made since the last CONFIG RESETSTAT.
      local function calls()
        local t = {}
        for name, n in raw:command("INFO", "commandstats"):gmatch("cmdstat_([%w_|]+):calls=(%d+)") do
          t[name] = tonumber(n)
        end
        return t
      end
      -- A first lock and release in the slot: not part of the count.
      assert(assert(holder:acquire("quiet", 5)):release())
      assert.are.equal("OK", raw:command("CONFIG", "RESETSTAT"))
      -- A millisecond apart: 16 takes within one millisecond of one slot
      -- run the acquire script (the record's ID tells no fence then), which
      -- a fast client reaches in a loop.
      for _ = 1, 20 do
        assert(assert(holder:acquire("quiet", 5)):release())
        core.sleep(0.001)
      end
      local quiet = calls()
      -- No wake-up work: no signal pushed, no queue looked at.
      for _, name in ipairs({ "rpush", "pexpire", "zrange", "zrangebyscore" }) do
        assert.is_nil(quiet[name], name .. " ran on an uncontended release")
      end
      -- Each acquire is a take, no script: MULTI, SET NX PX of the lock,
      -- XADD of the slot's record (Redis makes its ID, the fence, from its
      -- clock: no TIME), EXEC. No holder's fence key, no INFO, no
      -- connection names, no counter.
      assert.are.equal(20, quiet.multi)
      assert.are.equal(20, quiet.set)
      assert.are.equal(20, quiet.xadd)
      assert.are.equal(20, quiet.exec)
      for _, name in ipairs({ "time", "incr", "client|getname", "client|setname", "info", "eval", "type" }) do
        assert.is_nil(quiet[name], name .. " ran on an uncontended cycle")
      end
      -- Each release is the release script: GET of the lock, one EXISTS of
      -- the waiters mark and the handoff set, DEL of the lock and its
      -- holder's fence key (none here), at once.
      assert.are.equal(20, quiet.evalsha)
      assert.are.equal(20, quiet.get)
      assert.are.equal(20, quiet.exists)
      assert.are.equal(20, quiet.del)
      assert.are.equal(0, raw:command("EXISTS", "lock:{quiet}:waiters"))
      -- A failed try sets the mark (for the holder's TTL and a second) ...
      local lock = assert(holder:acquire("busy", 5))
      local other = srv:client()
      assert.is_nil(other:acquire("busy", 5))
      other:close()
      local left = raw:command("PTTL", "lock:{busy}:waiters")
      assert.is_true(left > 5000 and left <= 6000, "mark TTL " .. left)
      -- ... and the release then wakes: one signal, which expires by itself.
      assert.is_true(lock:release())
      assert.are.equal(1, raw:command("LLEN", "lock:{busy}:signal"))
      assert.are.equal(1, calls().rpush)
    end)

    it("takes, then tries the acquire script on a busy key, then registers; a hot key registers at once", function()
      -- What tells the tries apart on the server: the acquire script that
      -- finds the lock held sets the waiters mark, a registering try
      -- (acquire_wait) never does; a registering try that takes the lock
      -- drops its registration (ZREM), the acquire script has none to drop.
      local function zrems()
        return tonumber(raw:command("INFO", "commandstats"):match("cmdstat_zrem:calls=(%d+)") or "0")
      end
      assert(holder:acquire("hot", 0.3))
      local c = srv:client()
      local z0 = zrems()
      -- First wait: a take, then the acquire script (found busy), then registering tries,
      -- which wait it out.
      assert(c:acquire("hot", 0.3, { wait = 2 }))
      assert.are.equal(1, raw:command("EXISTS", "lock:{hot}:waiters"))
      assert.are.equal(z0 + 1, zrems())
      -- The key is busy again, and this client found it busy: it registers
      -- from its first try, no acquire script.
      assert.are.equal(1, raw:command("DEL", "lock:{hot}:waiters"))
      local b = assert(c:acquire("hot", 5, { wait = 2 }))
      assert.are.equal(0, raw:command("EXISTS", "lock:{hot}:waiters"))
      assert.are.equal(z0 + 2, zrems())
      -- Once a registering first try finds it free, the key cools down: the
      -- next waiting acquire takes first again (no registration to drop).
      assert.is_true(b:release())
      assert(assert(c:acquire("hot", 5, { wait = 2 })):release())
      assert.are.equal(z0 + 3, zrems())
      local runs = scripts_run()
      assert(assert(c:acquire("hot", 5, { wait = 2 })):release())
      assert.are.equal(z0 + 3, zrems())
      assert.are.equal(runs + 1, scripts_run()) -- the release's only
      c:close()
    end)

    it("waits longer than the client's reply timeout without a connection error", function()
      assert(holder:acquire("k", 30))
      local c = srv:client({ timeout = 0.2 })
      local none, err = c:acquire("k", 5, { wait = 0.6 })
      assert.is_nil(none)
      assert.is_truthy(err:match('^busy: "k" is still held by another owner after waiting 0%.6 s'), err)
      assert.are.equal("PONG", c:command("PING"))
      c:close()
    end)
  end)

  describe("with polling", function()
    it("never blocks in the server, and still gets the lock after a release", function()
      local lock = assert(holder:acquire("k", 30))
      local procs = { waiter("k", 20, "poll", "plain", 0, "p1"), waiter("k", 20, "poll", "plain", 0, "p2") }
      assert.is_truthy(helpers.eventually(5, function() return raw:command("LLEN", "pids") == 2 end))
      core.sleep(0.3) -- let them poll a few times
      assert.are.equal(0, blocked())
      assert.is_true(scripts_run() > 4, "the waiters did not poll")
      assert.is_true(lock:release())
      finish(procs)
      assert.are.equal(2, raw:command("LLEN", "order"))
    end)
  end)

  describe("a fair lock", function()
    -- Queues waiters one by one (each is in the queue before the next starts),
    -- releases, and returns the order in which they got the lock.
    local function queue_up(n, mode)
      local lock = assert(holder:acquire("fair", 30, { fair = true }))
      local procs = {}
      for i = 1, n do
        procs[i] = waiter("fair", 30, mode, "fair", 0.05, tostring(i))
        assert.is_truthy(helpers.eventually(5, function()
          return raw:command("ZCARD", "lock:{fair}:queue") == i
        end), "waiter " .. i .. " never queued")
      end
      assert.is_true(lock:release())
      finish(procs)
      return raw:command("LRANGE", "order", 0, -1)
    end

    it("serves 10 waiters in arrival order (notify)", function()
      assert.are.same({ "1", "2", "3", "4", "5", "6", "7", "8", "9", "10" }, queue_up(10, "notify"))
      assert.are.equal(0, raw:command("EXISTS", "lock:{fair}:queue", "lock:{fair}:hand"))
    end)

    it("serves waiters in arrival order (poll)", function()
      assert.are.same({ "1", "2", "3", "4" }, queue_up(4, "poll"))
    end)

    it("goes on when a queued waiter dies", function()
      local lock = assert(holder:acquire("fair", 30, { fair = true }))
      local doomed = waiter("fair", 30, "notify", "fair", 0, "doomed")
      assert.is_truthy(helpers.eventually(5, function() return raw:command("ZCARD", "lock:{fair}:queue") == 1 end))
      local next_one = waiter("fair", 30, "notify", "fair", 0, "next")
      assert.is_truthy(helpers.eventually(5, function() return raw:command("ZCARD", "lock:{fair}:queue") == 2 end))
      local pid = raw:command("LINDEX", "pids", 0)
      assert.is_true(helpers.sh_ok("kill -9 " .. pid))
      doomed.wait()
      assert.is_true(lock:release())
      -- The dead waiter was first in line; it is dropped once it fails to
      -- come back (3 s), and the next one gets the lock.
      local out = finish({ next_one })[1]
      assert.is_truthy(out:match("^got next"), out)
      assert.are.same({ "next" }, raw:command("LRANGE", "order", 0, -1))
      assert.are.equal(0, raw:command("ZCARD", "lock:{fair}:queue"))
    end)

    it("leaves the queue at once when the wait runs out", function()
      assert(holder:acquire("fair", 30, { fair = true }))
      local c = srv:client()
      local none, err = c:acquire("fair", 5, { wait = 0.2, fair = true })
      assert.is_nil(none)
      assert.is_truthy(err:match('^busy: "fair" is still held by another owner after waiting 0%.2 s'), err)
      assert.are.equal(0, raw:command("ZCARD", "lock:{fair}:queue"))
      c:close()
    end)

    it("is taken at once when free and nobody waits, and works with with_lock", function()
      local fence = holder:with_lock("fair", 5, function(lock) return lock.fence end, { fair = true })
      -- Taken at once by a grant in its slot (a fair waiter registers from
      -- its first try, a script): the slot's record holds its fence.
      assert.are.equal(fence, select(2, helpers.fence_record(raw, "fair")))
      assert.are.equal(0, raw:command("EXISTS", "lock:{fair}", "lock:{fair}:fence"))
    end)
  end)
end)
