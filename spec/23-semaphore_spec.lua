-- SPDX-License-Identifier: MIT
-- The counting semaphore (redislock/semaphore.lua) against a real server,
-- with OS processes: never more holders than the limit, and the limit
-- reached; a killed holder's permit back by its TTL (the server's clock);
-- a release waking exactly one waiter; renewal; with_permit's guarantees;
-- bad arguments. Under OpenResty: spec/50.
local core = require("redislock.core")
local helpers = require("spec.helpers")

describe("semaphore", function()
  local srv, raw, client

  helpers.client_for(function(s, r, c) srv, raw, client = s, r, c end)

  -- Runs workers (lists of primitive.lua arguments after the start time)
  -- at once; returns their summed overlaps.
  local function run_all(list)
    local start_at = core.now() + 0.5 * helpers.slow
    local procs = {}
    for i, a in ipairs(list) do
      procs[i] = helpers.spawn_primitive(srv.port, a[1], start_at, table.unpack(a, 2))
    end
    return helpers.overlaps(procs)
  end

  it("lets at most `limit` of eight processes in at once, and does reach the limit", function()
    local list = {}
    for i = 1, 8 do list[i] = { "sem", 3, 15 } end
    run_all(list)
    local seen = raw:command("LRANGE", "seen", 0, -1)
    assert.are.equal(8 * 15, #seen)
    local most = 0
    for _, n in ipairs(seen) do most = math.max(most, tonumber(n)) end
    assert.are.equal(3, most)
    -- Every permit had a fence of its own.
    local fences, distinct = raw:command("LRANGE", "fences", 0, -1), {}
    for _, f in ipairs(fences) do
      assert.is_nil(distinct[f], "fence " .. f .. " twice")
      distinct[f] = true
    end
    assert.are.equal(0, client:semaphore("pool", 3):count())
    assert.are.equal(0, raw:command("EXISTS", "lock:{pool}:permits"))
  end)

  it("gets a SIGKILLed holder's permit back after its TTL, by the server's clock", function()
    helpers.killed_holder(srv, raw, "the holder")
    local sem = client:semaphore("pool", 1)
    assert.are.equal(1, sem:count())
    local _, err = sem:acquire(5)
    assert.matches('^busy: all 1 permits of semaphore "pool" are taken', err)
    local t0 = core.now()
    local permit = assert(sem:acquire(5, { wait = 3 }))
    local waited = core.now() - t0
    assert.is_true(waited < 1.5 * helpers.slow, "waited " .. waited)
    assert.is_true(permit.fence >= 2)
    assert(permit:release())
  end)

  it("reclaims expired permits at the next acquire: count() does not count them", function()
    local sem = client:semaphore("pool", 2)
    assert(sem:acquire(0.1))
    assert(sem:acquire(0.1))
    assert.is_nil(sem:acquire(5))
    core.sleep(0.15)
    assert.are.equal(0, sem:count())
    local a = assert(sem:acquire(5))
    local b = assert(sem:acquire(5))
    assert.are.equal(2, sem:count())
    assert.are.equal(2, raw:command("ZCARD", "lock:{pool}:permits"))
    assert(a:release()); assert(b:release())
  end)

  it("hands the permit to one blocked waiter per release (notify)", function()
    local sem = client:semaphore("pool", 1)
    local mine = assert(sem:acquire(10))
    local function blocked()
      local n = 0
      for line in raw:command("CLIENT", "LIST"):gmatch("[^\n]+") do
        if line:find("cmd=blpop", 1, true) and line:find("flags=b", 1, true) then n = n + 1 end
      end
      return n
    end
    local start_at = core.now()
    local w1 = helpers.spawn_primitive(srv.port, "sem", start_at, 1, 1, 1)
    local w2 = helpers.spawn_primitive(srv.port, "sem", start_at, 1, 1, 1)
    assert.is_truthy(helpers.eventually(5, function() return blocked() == 2 end), "two waiters never blocked")
    local function scripts()
      return tonumber(raw:command("INFO", "commandstats"):match("cmdstat_evalsha:calls=(%d+)") or 0)
    end
    local before = scripts()
    assert(mine:release())
    assert.is_truthy(helpers.eventually(2, function() return tonumber(raw:command("LLEN", "seen")) >= 1 end))
    core.sleep(0.3) -- (a second waiter woken would try again by now)
    -- One was handed the permit and went in (it holds for a second); the
    -- other was not woken: it is still blocked, and ran no script since.
    -- The scripts: the release alone (it handed the permit over).
    assert.are.equal(1, tonumber(raw:command("LLEN", "seen")))
    assert.are.equal(1, blocked())
    assert.are.equal(1, scripts() - before)
    for _, w in ipairs({ w1, w2 }) do
      local out, ok = w.wait()
      assert.is_true(ok, out)
    end
    assert.are.equal(2, raw:command("LLEN", "seen"))
  end)

  it("renews a permit while it is held, and gives it back at release", function()
    local sem = client:semaphore("pool", 1)
    local permit = assert(sem:acquire(0.3, { renew = true }))
    core.sleep(0.9)
    assert.is_true(permit:check(true))
    local left = assert(permit:ttl())
    assert.is_true(left > 0 and left <= 0.3, "ttl " .. left)
    assert.is_true(permit:extend(5))
    core.sleep(0.1) -- a renewal in flight may land after the extend; the watchdog renews again at once
    assert.is_true(permit:ttl() > 3)
    assert.is_true(permit:release())
    assert.is_true(permit:release()) -- again: harmless
    assert.are.equal(0, sem:count())
  end)

  it("with_permit returns fn's values, re-raises its error unchanged, and raises lost", function()
    local sem = client:semaphore("pool", 1)
    local a, b = sem:with_permit(5, function(p)
      assert.are.equal(1, sem:count())
      assert.are.equal("pool", p.key)
      return 1, "two"
    end)
    assert.are.equal(1, a)
    assert.are.equal("two", b)
    local value = { code = 7 }
    local ok, err = pcall(sem.with_permit, sem, 5, function() error(value) end)
    assert.is_false(ok)
    assert.are.equal(value, err)
    assert.are.equal(0, sem:count())
    ok, err = pcall(sem.with_permit, sem, 5, function() raw:command("DEL", "lock:{pool}:permits") end)
    assert.is_false(ok)
    assert.matches('^lost: a permit of semaphore "pool" is no longer ours', err)
  end)

  it("does not meet a lock or a read-write lock of the same name", function()
    local lock = assert(client:acquire("pool", 5))
    local permit = assert(client:semaphore("pool", 1):acquire(5))
    local read = assert(client:rwlock("pool"):read(5))
    -- Beside them only the slot's fence record (csrc/scripts/README.md, "Fences").
    local record = "lock:{" .. core.era_tag(core.lock_slot("pool")) .. "}:fences"
    for _, k in ipairs(raw:command("KEYS", "*")) do
      if k ~= record then assert.matches("^lock:{pool}", k) end
    end
    assert(lock:release()); assert(permit:release()); assert(read:release())
  end)

  it("raises on bad arguments", function()
    for _, limit in ipairs({ 0, -1, 1.5, "3", 2 ^ 31, 0 / 0 }) do
      assert.has_error(function() client:semaphore("pool", limit) end)
    end
    assert.has_error(function() client:semaphore("pool") end,
                     "bad argument #2 to 'semaphore' (limit must be a whole number in 1..2147483647, got nil)")
    -- The bound in the message, and whole numbers shown whole (Lua 5.4's 2^31 is a float).
    assert.has_error(function() client:semaphore("pool", 2 ^ 31) end,
                     "bad argument #2 to 'semaphore' (limit must be a whole number in 1..2147483647, got 2147483648)")
    assert.are.equal('redislock semaphore "pool" (limit 2147483647)', tostring(client:semaphore("pool", 2 ^ 31 - 1)))
    assert.has_error(function() client:semaphore("", 1) end, "bad argument #1 to 'semaphore' (key must not be empty)")
    assert.has_error(function() client:semaphore(7, 1) end,
                     "bad argument #1 to 'semaphore' (key must be a string, got number)")
    assert.has_error(function() client:semaphore("pool", 1, 2) end)
    local sem = client:semaphore("pool", 1)
    assert.has_error(function() sem:acquire(0) end)
    assert.has_error(function() sem:acquire(5, { fair = true }) end)
    assert.has_error(function() sem:acquire(5, { bogus = 1 }) end,
                     "bad argument #2 to 'acquire' (unknown option \"bogus\")")
    assert.has_error(function() sem.acquire(5) end)
    assert.has_error(function() sem:with_permit(5, "nope") end)
    assert.has_error(function() sem:count(1) end)
    local closed = srv:client()
    closed:close()
    assert.has_error(function() closed:semaphore("pool", 1) end, "bad self to 'semaphore' (client is closed)")
  end)
end)
