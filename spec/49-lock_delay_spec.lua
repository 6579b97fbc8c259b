-- SPDX-License-Identifier: MIT
-- The lock delay (acquire's lock_delay): a hold lost without a release
-- (its holder stopped past its TTL, or never renewed it) keeps others out
-- for the delay after its TTL; its holder counts it lost at its TTL (a
-- holder stopped with SIGSTOP and woken after its TTL learns it, and
-- renews nothing); a release or a forced one ends the delay at once. For a
-- lock, a semaphore's permit and a read-write lock's holds, in a Redis
-- Cluster and under OpenResty; bad values raise; Redlock, multi-key locks
-- and elections refuse it.
local core = require("redislock.core")
local helpers = require("spec.helpers")

describe("the lock delay", function()
  local srv, raw, client, other
  local stopped -- the PID of a process a spec sent SIGSTOP, until it sends SIGCONT

  helpers.redis_for(function(s, r) srv, raw = s, r end, { flush = true })
  before_each(function() client, other = srv:client(), srv:client() end)
  after_each(function()
    client:close()
    other:close()
    -- A spec that failed between SIGSTOP and SIGCONT must not leave its
    -- worker stopped (the suite would wait for it for ever).
    if stopped then helpers.sh_ok("kill -CONT " .. stopped .. " 2>/dev/null") end
    stopped = nil
  end)

  -- Starts a worker holding key (kind "lock" or "permit") for ttl seconds
  -- with the delay, renewed, for `seconds` (with cpu, computing: only its
  -- watchdog looks at the lock meanwhile); returns it, its PID, and the
  -- time (core.now()) it was stopped with SIGSTOP once it held the lock.
  local function stopped_holder(kind, key, ttl, delay, seconds, cpu)
    local proc = helpers.spawn(helpers.spec_dir .. "workers/delayed.lua", srv.port, kind, key, ttl, delay, seconds,
                               cpu and "cpu" or "")
    assert.is_truthy(helpers.eventually(10, function() return raw:command("LLEN", "holders") == 1 end))
    local pid = raw:command("LINDEX", "holders", 0):match("^(%d+) %d+$")
    local at = core.now()
    assert.is_true(helpers.sh_ok("kill -STOP " .. pid))
    stopped = pid
    return proc, pid, at
  end

  local function resume(pid)
    assert.is_true(helpers.sh_ok("kill -CONT " .. pid))
    stopped = nil
  end

  -- Sleeps until core.now() is at.
  local function sleep_until(at)
    local left = at - core.now()
    if left > 0 then core.sleep(left) end
  end

  describe("a holder in another process, stopped past its TTL", function()
    it("keeps the lock closed until TTL + delay: tries are refused before, one succeeds after", function()
      local ttl, delay = 1, 1.5
      local proc, pid, at = stopped_holder("lock", "paused", ttl, delay, 8)
      -- The server keeps it the delay past the holder's TTL (its last
      -- renewal was at most a third of the TTL before the stop).
      local left = raw:command("PTTL", "lock:{paused}")
      assert.is_true(left > (delay + ttl / 2) * 1000, "PTTL " .. left)
      local expiry = at + left / 1000
      sleep_until(at + ttl + 0.1) -- past the holder's TTL
      local lock, err, taken
      repeat
        lock, err = other:acquire("paused", 5)
        if lock then
          taken = core.now()
        else
          assert.is_truthy(err:match("^busy: "), err)
          core.sleep(0.05)
        end
      until lock or core.now() > expiry + 5
      assert.is_truthy(lock, "never free after the delay")
      assert.is_true(taken >= expiry - 0.005,
                     string.format("taken %.3f s before TTL + delay ran out", expiry - taken))
      assert.is_true(taken >= at + delay + ttl / 2, string.format("taken %.3f s after the stop", taken - at))
      resume(pid)
      local out, ok = proc.wait()
      assert.is_true(ok, out)
      assert.is_truthy(out:find('raised lost: "paused" is no longer ours', 1, true), out)
      assert(lock:release())
    end)

    it("makes a waiter wait out the delay: granted no earlier than TTL + delay", function()
      local ttl, delay = 1, 1.5
      local proc, pid, at = stopped_holder("lock", "waited", ttl, delay, 8)
      local left = raw:command("PTTL", "lock:{waited}")
      assert.is_true(left > (delay + ttl / 2) * 1000, "PTTL " .. left)
      sleep_until(at + ttl + 0.1)
      local lock = assert(other:acquire("waited", 5, { wait = 10 }))
      local taken = core.now()
      assert.is_true(taken >= at + left / 1000 - 0.005,
                     string.format("granted %.3f s before TTL + delay ran out", at + left / 1000 - taken))
      resume(pid)
      local out, ok = proc.wait()
      assert.is_true(ok, out)
      assert(lock:release())
    end)

    it("learns its lease is lost when woken (SIGCONT) after its TTL, and renews nothing", function()
      local ttl, delay = 1, 2
      local proc, pid, at = stopped_holder("lock", "woken", ttl, delay, 8)
      local expiry = at + raw:command("PTTL", "lock:{woken}") / 1000
      sleep_until(at + ttl + 0.3) -- past its TTL, well within the delay
      resume(pid)
      local out, ok = proc.wait()
      assert.is_true(ok, out)
      local lost_at = tonumber(out:match("lost (%S+) lost: \"woken\" is no longer ours %(its TTL ran out"))
      assert.is_truthy(lost_at, out)
      assert.is_true(lost_at < expiry, "it learned only after others could enter")
      assert.is_truthy(out:find('raised lost: "woken" is no longer ours', 1, true), out)
      assert.is_nil(other:acquire("woken", 5))
    end)

    it("is found lost by its watchdog when woken after its TTL, which renews nothing", function()
      local ttl, delay = 1, 2
      -- It computes for 2 s: computing at 1.3 s, it looks at its lock after.
      local proc, pid, at = stopped_holder("lock", "computing", ttl, delay, 2, true)
      local expiry = at + raw:command("PTTL", "lock:{computing}") / 1000
      sleep_until(at + ttl + 0.3) -- past its TTL, well within the delay
      local before = raw:command("PTTL", "lock:{computing}")
      local read_at = core.now()
      resume(pid)
      local out, ok = proc.wait()
      assert.is_true(ok, out)
      local lost_at = tonumber(out:match("lost (%S+) lost: \"computing\" is no longer ours %(its TTL ran out before"
                                         .. " it could be renewed %(paused%?%); the lock delay keeps others out;"
                                         .. " found by the watchdog%)"))
      assert.is_truthy(lost_at, out)
      assert.is_true(lost_at < expiry, "it learned only after others could enter")
      assert.is_truthy(out:find('raised lost: "computing" is no longer ours', 1, true), out)
      -- Its watchdog did not renew it, nor did it give it back: the delay runs on.
      local after = raw:command("PTTL", "lock:{computing}")
      assert.is_true(after > 0, "the lock is gone before TTL + delay")
      assert.is_true(after <= before - (core.now() - read_at) * 1000 + 20,
                     string.format("renewed after its TTL: PTTL %d, then %d", before, after))
      assert.is_nil(other:acquire("computing", 5))
    end)

    it("keeps a semaphore's permit taken until TTL + delay", function()
      local ttl, delay = 1, 1.5
      local proc, pid, at = stopped_holder("permit", "pool", ttl, delay, 8)
      local sem = other:semaphore("pool", 1)
      sleep_until(at + ttl + 0.1)
      local permit, err, taken
      repeat
        permit, err = sem:acquire(5)
        if permit then
          taken = core.now()
        else
          assert.is_truthy(err:match("^busy: "), err)
          core.sleep(0.05)
        end
      until permit or core.now() > at + ttl + delay + 5
      assert.is_truthy(permit, "never free after the delay")
      assert.is_true(taken >= at + delay + ttl / 2, string.format("taken %.3f s after the stop", taken - at))
      resume(pid)
      local out, ok = proc.wait()
      assert.is_true(ok, out)
      assert.is_truthy(out:find('raised lost: a permit of semaphore "pool" is no longer ours', 1, true), out)
      assert(permit:release())
    end)
  end)

  describe("in this process", function()
    it("counts the TTL for its holder and TTL + delay on the server", function()
      local lock = assert(client:acquire("own", 0.6, { lock_delay = 1 }))
      local left = raw:command("PTTL", "lock:{own}")
      assert.is_true(left > 1400 and left <= 1600, "PTTL " .. left)
      local ttl = assert(lock:ttl())
      assert.is_true(ttl > 0.4 and ttl <= 0.6, "ttl() " .. ttl)
      assert(lock:extend(1))
      left = raw:command("PTTL", "lock:{own}")
      assert.is_true(left > 1800 and left <= 2000, "PTTL after extend " .. left)
      local began = core.now()
      sleep_until(began + 1.1) -- past its TTL, within the delay
      local ok, err = lock:extend(5)
      assert.is_nil(ok)
      assert.is_truthy(err:find('^lost: "own" is no longer ours %(its TTL ran out'), err)
      assert.is_true(raw:command("PTTL", "lock:{own}") <= 900, "an extend past the TTL lengthened it")
      assert.is_nil(other:acquire("own", 5))
      local theirs = assert(other:acquire("own", 5, { wait = 5 }))
      assert.is_true(core.now() >= began + 1.9, "taken before TTL + delay")
      assert(theirs:release())
    end)

    it("says lost when an extend's answer comes after the TTL ran out", function()
      local patient = srv:client({ timeout = 5 })
      local lock = assert(patient:acquire("late", 0.5, { lock_delay = 2 }))
      -- The server holds the extend back (a write) past the holder's TTL.
      assert.are.equal("OK", raw:command("CLIENT", "PAUSE", 800, "WRITE"))
      local ok, err = lock:extend(0.5)
      assert.is_nil(ok)
      assert.is_truthy(err:find('^lost: "late" is no longer ours %(its TTL ran out before the extend came back'), err)
      assert.is_nil((lock:check()))
      patient:close()
    end)

    it("says lost at the TTL without renewal (check, ttl)", function()
      local lock = assert(client:acquire("check", 0.3, { lock_delay = 1 }))
      core.sleep(0.4)
      local ok, err = lock:check()
      assert.is_nil(ok)
      assert.is_truthy(err:find('^lost: "check" is no longer ours %(its TTL ran out'), err)
      local lock2 = assert(client:acquire("check2", 0.3, { lock_delay = 1 }))
      core.sleep(0.4)
      ok, err = lock2:ttl()
      assert.is_nil(ok)
      assert.is_truthy(err:find('^lost: "check2" is no longer ours %(its TTL ran out'), err)
      assert.is_nil(other:acquire("check", 5))
    end)

    it("has no delay after a release", function()
      local lock = assert(client:acquire("released", 30, { lock_delay = 60 }))
      assert(lock:release())
      local theirs = assert(other:acquire("released", 5))
      assert(theirs:release())
      assert.are.equal(7, client:with_lock("released", 30, function() return 7 end, { lock_delay = 60 }))
      assert(assert(other:acquire("released", 5)):release())
    end)

    it("has no delay after a forced release", function()
      assert(client:acquire("forced", 30, { lock_delay = 60 }))
      assert.is_nil(other:acquire("forced", 5))
      assert.is_true(other:force_release("forced"))
      assert(assert(other:acquire("forced", 5)):release())
    end)

    it("has no delay after a permit's release; a permit not given back waits it out", function()
      local sem = client:semaphore("permits", 1)
      local permit = assert(sem:acquire(30, { lock_delay = 60 }))
      assert(permit:release())
      assert(assert(other:semaphore("permits", 1):acquire(5)):release())
      assert(sem:acquire(0.2, { lock_delay = 0.6 }))
      local began = core.now()
      core.sleep(0.4)
      assert.is_nil(other:semaphore("permits", 1):acquire(5))
      assert(assert(other:semaphore("permits", 1):acquire(5, { wait = 5 })):release())
      assert.is_true(core.now() >= began + 0.75, "a permit taken before TTL + delay")
    end)

    it("holds a read-write lock's write and read holds", function()
      local rw = client:rwlock("doc")
      assert(rw:write(0.2, { lock_delay = 0.6 }))
      local began = core.now()
      core.sleep(0.4)
      assert.is_nil(other:rwlock("doc"):read(5))
      assert(assert(other:rwlock("doc"):read(5, { wait = 5 })):release())
      assert.is_true(core.now() >= began + 0.75, "read before the write hold's TTL + delay")
      assert(rw:read(0.2, { lock_delay = 0.6 }))
      began = core.now()
      core.sleep(0.4)
      assert.is_nil(other:rwlock("doc"):write(5))
      assert(assert(other:rwlock("doc"):write(5, { wait = 5 })):release())
      assert.is_true(core.now() >= began + 0.75, "written before the read hold's TTL + delay")
    end)

    it("is none at 0: the server keeps the TTL alone", function()
      assert(client:acquire("none", 1, { lock_delay = 0 }))
      assert.is_true(raw:command("PTTL", "lock:{none}") <= 1000)
    end)
  end)

  describe("in a Redis Cluster", function()
    local cl

    lazy_setup(function() cl = helpers.start_cluster({ masters = 3, replicas = 0 }) end)
    lazy_teardown(function() if cl then cl:stop() end end)

    it("is kept on the lock's node, renewed there with the delay; a release ends it", function()
      local c = require("redislock").new({ cluster = cl.seeds })
      local owner = cl:owner(core.lock_slot("spread"))
      local function left() return tonumber(owner:cli("PTTL", "lock:{spread}")) end
      c:with_lock("spread", 0.6, function(lock)
        assert.is_true(left() > 1400, "PTTL " .. left())
        core.sleep(1) -- past its first TTL: renewed by the watchdog
        assert.is_true(left() > 1000, "PTTL after renewals " .. left())
        assert.is_true(assert(lock:ttl()) <= 0.6)
      end, { lock_delay = 1 })
      assert.are.equal(-2, left())
      c:close()
    end)
  end)

  -- Under OpenResty, in a real nginx with the lua module (the LuaJIT
  -- pass): the worker's renewal timer renews with the delay on top, and a
  -- worker stopped past its TTL learns its lease is lost when woken.
  describe("under OpenResty", function()
    if helpers.no_nginx(pending) then return end
    local http = require("spec.support.http")
    local ngx = helpers.app_nginx_for(function() return srv end, 1)

    it("renews with the delay on top, and a release leaves none", function()
      local req = http.start(ngx.port, "GET", "/with_lock?key=renewed&ttl=0.6&hold=1.5&lock_delay=1")
      assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{renewed}") == 1 end))
      core.sleep(0.9) -- past its first TTL: renewed by the timer
      local left = raw:command("PTTL", "lock:{renewed}")
      assert.is_true(left > 1000, "PTTL " .. left)
      local status, body = req:finish()
      assert.are.equal(200, status, body)
      assert(assert(other:acquire("renewed", 5)):release())
    end)

    it("a worker stopped past its TTL learns its lease is lost when woken, and renews nothing", function()
      local req = http.start(ngx.port, "GET", "/with_lock?key=stopped&ttl=0.6&hold=2&lock_delay=2&on_lost=1")
      assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{stopped}") == 1 end))
      local pid = assert(ngx:workers()[1])
      local at = core.now()
      assert.is_true(helpers.sh_ok("kill -STOP " .. pid))
      stopped = pid
      local expiry = at + raw:command("PTTL", "lock:{stopped}") / 1000
      sleep_until(at + 0.9) -- past its TTL, well within the delay
      assert.is_nil(other:acquire("stopped", 5))
      local before = raw:command("PTTL", "lock:{stopped}")
      local read_at = core.now()
      resume(pid)
      local status, body = req:finish()
      assert.are.equal(409, status, body)
      assert.is_truthy(body:find('^lost: "stopped" is no longer ours %(its TTL ran out before it could be renewed'
                                 .. ' %(paused%?%); the lock delay keeps others out; found by the renewal timer%)'),
                       body)
      assert.is_truthy(body:find('| on_lost: lost: "stopped"', 1, true), body)
      assert.is_true(core.now() < expiry, "it learned only after others could enter")
      local after = raw:command("PTTL", "lock:{stopped}")
      assert.is_true(after > 0, "the lock is gone before TTL + delay")
      assert.is_true(after <= before - (core.now() - read_at) * 1000 + 20,
                     string.format("renewed after its TTL: PTTL %d, then %d", before, after))
    end)
  end)

  describe("bad values", function()
    it("raise clear errors", function()
      for _, v in ipairs({ -1, 0 / 0, 1 / 0, 86401, "1", true }) do
        assert.has_error(function() client:acquire("bad", 1, { lock_delay = v }) end)
        local ok, err = pcall(client.with_lock, client, "bad", 1, function() end, { lock_delay = v })
        assert.is_false(ok)
        assert.is_truthy(tostring(err):find("bad argument #4 to 'with_lock' (option 'lock_delay' must be a number "
                                            .. "of seconds in 0..86400, got ", 1, true), tostring(err))
      end
      local ok, err = pcall(client.acquire, client, "bad", 1, { lock_delay = -1 })
      assert.is_false(ok)
      assert.is_truthy(err:find("bad argument #3 to 'acquire' (option 'lock_delay' must be a number of seconds"
                                .. " in 0..86400, got -1)", 1, true), err)
      ok, err = pcall(client:semaphore("bad", 2).acquire, client:semaphore("bad", 2), 1, { lock_delay = "x" })
      assert.is_false(ok)
      assert.is_truthy(err:find("bad argument #2 to 'acquire' (option 'lock_delay' must be a number of seconds"
                                .. ' in 0..86400, got "x")', 1, true), err)
      ok, err = pcall(client.acquire, client, "bad", core.MAX_MS / 1000, { lock_delay = 1 })
      assert.is_false(ok)
      assert.is_truthy(err:find("ttl and option 'lock_delay' must add up to at most", 1, true), err)
      assert.are.equal(0, raw:command("EXISTS", "lock:{bad}"))
    end)

    it("are refused where the delay is not built: Redlock, multi-key locks, elections", function()
      local red = require("redislock").new({ redlock = { "redis://127.0.0.1:1", "redis://127.0.0.1:2",
                                                         "redis://127.0.0.1:3" } })
      local ok, err = pcall(red.acquire, red, "k", 1, { lock_delay = 1 })
      assert.is_false(ok)
      assert.is_truthy(err:find("option 'lock_delay' is not available with 'redlock'", 1, true), err)
      red:close()
      ok, err = pcall(client.acquire, client, { "a", "b" }, 1, { lock_delay = 1 })
      assert.is_false(ok)
      assert.is_truthy(err:find("option 'lock_delay' is not available for a multi-key lock", 1, true), err)
      local e = client:election("delay")
      ok, err = pcall(e.campaign, e, "me", 1, { lock_delay = 1 })
      assert.is_false(ok)
      assert.is_truthy(err:find("option 'lock_delay' is not available (not built for elections", 1, true), err)
    end)
  end)
end)
