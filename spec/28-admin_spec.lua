-- SPDX-License-Identifier: MIT
-- For operators and metrics: who holds a lock (carried by its token, no
-- extra round trip), client:inspect, client:force_release, and the
-- observer hook's events.
local core = require("redislock.core")
local helpers = require("spec.helpers")

describe("inspect, force_release, observer", function()
  local srv, raw

  helpers.redis_for(function(s, r) srv, raw = s, r end, { flush = true })

  it("inspect tells whether a lock is held, its time left, its fence and who holds it", function()
    local c = srv:client({ label = "reconcile" })
    local free = assert(c:inspect("job"))
    assert.is_false(free.held)
    assert.is_nil(free.fence)
    local lock = assert(c:acquire("job", 5))
    local info = assert(c:inspect("job"))
    assert.is_true(info.held)
    assert.is_true(info.ttl > 4 and info.ttl <= 5)
    -- Taken at its first try (a transaction, no script): the server keeps
    -- no holder's fence, which would cost every lock a write (the holder
    -- has it: lock.fence).
    assert.is_nil(info.fence)
    assert.are.equal(lock.token, info.token)
    assert.are.equal(core.getpid(), info.holder.pid)
    assert.are.equal(core.hostname():gsub("[^%w%._:@%-]", "_"), info.holder.host)
    assert.is_true(math.abs(info.holder.since - os.time()) <= 2)
    assert.are.equal("reconcile", info.holder.label)
    assert(lock:release())
    info = assert(c:inspect("job"))
    assert.is_false(info.held)
    assert.is_nil(info.fence) -- free: no holder, no fence (the next holder's is above lock.fence, below)
    -- holder = false: the token is the 32 random digits alone.
    local bare = srv:client({ holder = false })
    local l2 = assert(bare:acquire("job", 5))
    assert.is_true(l2.fence > lock.fence)
    assert.matches("^%x+$", l2.token)
    assert.are.equal(32, #l2.token)
    assert.is_nil(assert(bare:inspect("job")).holder)
    assert(l2:release())
    -- A lock a script took (a waiter's, a resend's, a handoff's, an
    -- election's) keeps its holder's fence: inspect tells it.
    local r = srv:raw()
    local tok = core.token()
    local status, fence = r:eval("acquire", "job", tok, 5000)
    assert.are.equal(1, status)
    assert.are.equal(fence, assert(c:inspect("job")).fence)
    assert.is_true(fence > l2.fence)
    assert.are.equal(1, (r:eval("release", "job", tok)))
    r:close()
    c:close(); bare:close()
  end)

  it("force_release frees a lock whoever holds it, wakes a waiter, and keeps fences growing", function()
    local c = srv:client()
    local holder = srv:client()
    local lock = assert(holder:acquire("job", 30))
    local waiter = helpers.spawn(helpers.spec_dir .. "workers/hold.lua", srv.port, "job", 0)
    assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{job}:waiters") == 1 end))
    local t0 = core.now()
    assert.is_true(c:force_release("job"))
    local out, ok = waiter.wait()
    assert.is_true(ok, out)
    assert.is_true(core.now() - t0 < 1 * helpers.slow, "the waiter was not woken")
    local next_lock = assert(c:acquire("job", 5))
    assert.is_true(next_lock.fence > lock.fence)
    local gone, err = lock:release()
    assert.is_nil(gone)
    assert.matches("^lost:", err)
    assert(next_lock:release())
    assert.is_false(c:force_release("job"))
    assert.has_error(function() c:force_release("") end, "bad argument #1 to 'force_release' (key must not be empty)")
    assert.has_error(function() c:inspect() end, "bad argument #1 to 'inspect' (key must be a string, got nil)")
    c:close(); holder:close()
  end)

  it("tells the observer of acquired, waiting, waited, busy, released and lost, and drops its errors", function()
    local events = {}
    local c = srv:client({ observer = function(event, info)
      events[#events + 1] = info
      info.event = event
      if event == "released" then error("an observer's error") end
    end })
    local lock = assert(c:acquire("job", 5))
    assert.is_nil(c:acquire("job", 5, { wait = 0.05 }))
    core.sleep(0.01)
    assert.is_true(lock:release()) -- the observer raised: dropped
    local permit = assert(c:semaphore("pool", 1):acquire(5))
    raw:command("DEL", "lock:{pool}:permits")
    assert.is_nil(permit:release())
    local seen = {}
    for _, e in ipairs(events) do seen[#seen + 1] = e.event .. " " .. e.kind .. " " .. e.key end
    assert.are.same({ "acquired lock job", "waiting lock job", "waited lock job", "busy lock job", "released lock job",
                      "acquired permit pool", "lost permit pool" }, seen)
    assert.are.equal(lock.fence, events[1].fence)
    assert.is_true(events[1].wait >= 0 and events[1].wait < 1)
    assert.is_true(events[4].waited >= 0.05)
    assert.matches("^busy:", events[4].why)
    assert.is_true(events[5].held >= 0.01)
    assert.matches("expired or was deleted", events[7].why)
    assert.is_true(events[7].held >= 0)
    -- A multi-key lock: each key, as single locks.
    events = {}
    local multi = assert(c:acquire({ "b", "a" }, 5))
    assert(multi:release())
    seen = {}
    for _, e in ipairs(events) do seen[#seen + 1] = e.event .. " " .. e.kind .. " " .. e.key end
    assert.are.same({ "acquired lock a", "acquired lock b", "released lock a", "released lock b" }, seen)
    helpers.new_fails({ observer = 1 }, "bad argument #1 to 'new' (option 'observer' must be a function, got number)")
    local label = "bad argument #1 to 'new' (option 'label' must be 1 to 64 letters, digits or . _ : @ -)"
    helpers.new_fails({ label = ("x"):rep(65) }, label)
    helpers.new_fails({ label = "a/b" }, label)
    helpers.new_fails({ holder = "no" }, "bad argument #1 to 'new' (option 'holder' must be a boolean, got string)")
    c:close()
  end)
end)
