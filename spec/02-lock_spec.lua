-- SPDX-License-Identifier: MIT
-- acquire, release, extend, ttl and fencing against a real redis-server.
local core = require("redislock.core")
local crc16 = require("spec.crc16")
local helpers = require("spec.helpers")

describe("locks", function()
  local srv, client, raw

  helpers.client_each(function(s, r, c) srv, raw, client = s, r, c end)

  -- Asserts that name's PTTL on the server is above low ms, and at most
  -- high (if given).
  local function pttl_in(name, low, high)
    local pttl = raw:command("PTTL", name)
    assert.is_true(pttl > low and pttl <= (high or math.huge), name .. ": " .. tostring(pttl))
  end

  -- The acquire script run alone (no take before it, as a resend, a waiter
  -- or a handoff runs it) over the raw client c, on "k" with token tok for
  -- ms; asserts that it took the lock and returns the fence it granted.
  local function script_takes(c, tok, ms)
    local status, fence = c:eval("acquire", "k", tok, ms)
    assert.are.equal(1, status)
    return fence
  end

  it("takes the key with its token and a TTL in one step", function()
    local lock = assert(client:acquire("orders:42", 5))
    assert.are.equal("orders:42", lock.key)
    -- 32 random hex digits, then who holds it: /host/pid/since (unix s)
    local hex, pid, since = lock.token:match("^(%x+)/[^/]+/(%d+)/(%d+)$")
    assert.are.equal(32, #hex, lock.token)
    assert.are.equal(core.getpid(), tonumber(pid))
    assert.is_true(math.abs(tonumber(since) - os.time()) <= 2)
    assert.are.equal(lock.token, raw:command("GET", "lock:{orders:42}"))
    pttl_in("lock:{orders:42}", 4000, 5000)
  end)

  it("says busy while another owner holds it, and leaves that owner alone", function()
    local lock = assert(client:acquire("k", 5))
    local other = srv:client()
    local none, err = other:acquire("k", 5)
    assert.is_nil(none)
    assert.is_truthy(err:match('^busy: "k" is held by another owner %(%d[%d.]* s left%)$'), err)
    assert.are.equal(lock.token, raw:command("GET", "lock:{k}"))
    other:close()
  end)

  it("takes every TTL a Lua number holds exactly in milliseconds (up to 2^53 ms)", function()
    -- node-redlock's suite: MAX_SAFE_INTEGER / 10 ms, then three times that.
    local long = (2 ^ 53 - 1) / 10 / 1000
    local lock = assert(client:acquire("long", long))
    assert.is_true(raw:command("PTTL", "lock:{long}") > 900719925474000)
    assert.is_true(lock:extend(3 * long))
    assert.is_true(lock:ttl() > 2702159776422)
    assert.is_true(lock:release())
    -- The largest, renewed (with_lock's default) and waited for.
    local max = 2 ^ 53 / 1000
    assert.is_true(client:with_lock("long", max, function(l)
      return raw:command("PTTL", "lock:{long}") > 9007199254000000 and l:check()
    end, { wait = max }))
    assert.are.equal(0, raw:command("EXISTS", "lock:{long}"))
  end)

  it("releases by compare-and-delete, and a second release is harmless", function()
    local lock = assert(client:acquire("k", 5))
    assert.is_true(lock:release())
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}"))
    assert.is_true(lock:release())
    assert.is_truthy(client:acquire("k", 5))
  end)

  it("releases, extends and reads a lock known only by its key and token", function()
    local lock = assert(client:acquire("k", 5))
    local other = srv:client()
    local same = other:from_token("k", lock.token)
    assert.is_nil(same.fence)
    assert.is_true(same:extend(20))
    assert.is_true(assert(lock:ttl()) > 19)
    assert.is_true(same:release())
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}"))
    local _, err = lock:release()
    assert.is_truthy(err:match("^lost: "), err)
    -- A token that is not the holder's touches nothing.
    local held = assert(client:acquire("k", 5))
    local _, err2 = other:from_token("k", core.token()):release()
    assert.is_truthy(err2:match('^lost: "k" is no longer ours %(another owner holds it now'), err2)
    assert.are.equal(held.token, raw:command("GET", "lock:{k}"))
    other:close()
  end)

  it("extends: the remaining time becomes the new ttl", function()
    local lock = assert(client:acquire("k", 1))
    assert.is_true(lock:extend(30))
    pttl_in("lock:{k}", 29000, 30000)
    local left = assert(lock:ttl())
    assert.is_true(left > 29 and left <= 30, tostring(left))
  end)

  it("reports lost, and touches nothing, once the lock expired and another owner took it", function()
    local lock = assert(client:acquire("k", 0.05))
    core.sleep(0.1)
    local other = srv:client()
    local theirs = assert(other:acquire("k", 5))
    for _, call in ipairs({ function() return lock:extend(5) end,
                            function() return lock:ttl() end,
                            function() return lock:release() end }) do
      local ok, err = call()
      assert.is_nil(ok)
      assert.is_truthy(err:match('^lost: "k" is no longer ours'), err)
    end
    -- The token is compared on the server: the other owner's lock survived.
    assert.are.equal(theirs.token, raw:command("GET", "lock:{k}"))
    pttl_in("lock:{k}", 4000)
    other:close()
  end)

  it("reports lost when the lock expired with no new owner", function()
    local lock = assert(client:acquire("k", 0.05))
    core.sleep(0.1)
    local ok, err = lock:release()
    assert.is_nil(ok)
    assert.is_truthy(err:find("expired or was deleted", 1, true), err)
    assert.is_nil((lock:extend(1)))
  end)

  it("gives fencing tokens that only grow, across holders and expiry", function()
    local last = 0
    for i = 1, 6 do
      local lock = assert(client:acquire("fenced", 0.03))
      assert.is_true(lock.fence > last, "holder " .. i)
      assert.are.equal(math.floor(lock.fence), lock.fence)
      last = lock.fence
      if i % 2 == 0 then
        lock:release()
      else
        core.sleep(0.05) -- let it expire
      end
    end
    -- Nothing of the name stays; the slot's fence record, which the next
    -- fence must pass, never expires and stands for the last one.
    assert.are.equal(0, raw:command("EXISTS", "lock:{fenced}:fence"))
    local record, top = helpers.fence_record(raw, "fenced")
    assert.are.equal(-1, raw:command("PTTL", record))
    assert.are.equal(last, top)
  end)

  it("takes an uncontended lock without a script, its fence the slot record's new ID", function()
    assert.are.equal("OK", raw:command("CONFIG", "RESETSTAT"))
    local lock = assert(client:acquire("k", 5))
    local _, top = helpers.fence_record(raw, "k")
    assert.are.equal(top, lock.fence)
    assert.are.equal(0, helpers.scripts_run(raw))
    -- A take keeps no holder's fence (it would cost every lock a write).
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}:fence"))
    assert.is_true(lock:release())
  end)

  it("keeps the holder's fence of a lock a script took for its granted TTL, and drops it with the lock", function()
    -- A lock taken by its acquire script (a resend's, a waiter's, a
    -- handoff's, an election's) keeps its holder's fence beside it, with
    -- the TTL it was granted (an extend touches the lock's key alone, as
    -- it must on a cluster slot half moved; an election's renewal extends
    -- both).
    local c = srv:raw()
    local tok = core.token()
    local fence = script_takes(c, tok, 5000)
    assert.are.equal(tostring(fence), raw:command("GET", "lock:{k}:fence"))
    pttl_in("lock:{k}:fence", 4000, 5000)
    assert.are.equal(1, (c:eval("extend", "k", tok, 20000)))
    pttl_in("lock:{k}", 19000)
    assert.are.equal(1, (c:eval("release", "k", tok)))
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}:fence"))
    c:close()
  end)

  it("keeps the lock, its holder's fence and the slot's fence record in one hash slot", function()
    for _, key in ipairs({ "orders:42", "a{b}c", "{x}", "x}", "plain" }) do
      local lock = assert(client:acquire(key, 5))
      local name = "lock:{" .. key .. "}"
      assert.are.equal(lock.token, raw:command("GET", name))
      assert.are.equal(crc16.slot(name), crc16.slot(name .. ":fence"), key)
      local record, top = helpers.fence_record(raw, key)
      assert.are.equal(lock.fence, top, key)
      assert.are.equal(crc16.slot(name), crc16.slot(record), key)
    end
  end)

  it("uses the prefix option", function()
    local c = srv:client({ prefix = "app:" })
    local lock = assert(c:acquire("k", 5))
    assert.are.equal(lock.token, raw:command("GET", "app:{k}"))
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}"))
    c:close()
  end)

  it("passes keys to the server as data, whatever bytes they hold", function()
    assert.are.equal("OK", raw:command("SET", "sentinel", "1"))
    local nasty = "x') redis.call('FLUSHALL') --\"\n]]\0end"
    local lock = assert(client:acquire(nasty, 5))
    assert.are.equal(lock.token, raw:command("GET", "lock:{" .. nasty .. "}"))
    assert.are.equal("1", raw:command("GET", "sentinel"))
    assert.is_true(lock:release())
    assert.are.equal("1", raw:command("GET", "sentinel"))
  end)

  it("falls back to EVAL when the server lost its script cache", function()
    local lock = assert(client:acquire("k", 5))
    assert.are.equal("OK", raw:command("SCRIPT", "FLUSH"))
    assert.is_true(lock:extend(5))
    assert.is_truthy(lock:ttl())
    assert.is_true(lock:release())
    assert.are.equal("OK", raw:command("SCRIPT", "FLUSH"))
    local again = assert(client:acquire("k", 5))
    assert.is_true(again.fence > lock.fence)
    -- A busy lock: the take finds it held, and the acquire script answers busy, by EVAL again.
    local busy, err = client:acquire("k", 5)
    assert.is_nil(busy)
    assert.is_truthy(err:match("^busy: "), err)
    assert.is_true(again:release())
    -- EVAL cached the scripts again, so the next calls go by EVALSHA.
    assert.are.same({ 1, 1 }, raw:command("SCRIPT", "EXISTS", core.scripts.acquire.sha, core.scripts.release.sha))
  end)

  it("treats a resent acquire with the same token as success", function()
    -- What a retry after a timed-out send does: the first send landed.
    local c = srv:raw()
    local tok = core.token()
    local fence1 = script_takes(c, tok, 1000)
    core.sleep(0.05)
    local fence2 = script_takes(c, tok, 1000)
    -- The first answer was lost (nobody saw fence1): the resend's is a new
    -- one, above it, and it is the holder's fence from then on.
    assert.is_true(fence2 > fence1, fence2 .. " > " .. fence1)
    assert.are.equal(tostring(fence2), raw:command("GET", "lock:{k}:fence"))
    pttl_in("lock:{k}", 960) -- the TTL refreshed
    local s3, left = c:eval("acquire", "k", core.token(), 1000)
    assert.are.equal(-1, s3)
    assert.is_true(left > 0)
    -- Should the holder's fence and the slot's record vanish (FLUSHDB,
    -- eviction), a resend still answers a fence above every earlier one
    -- (the clock's, which moved on since).
    core.sleep(0.002)
    local record = helpers.fence_record(raw, "k")
    assert.are.equal(2, raw:command("DEL", "lock:{k}:fence", record))
    local fence4 = script_takes(c, tok, 1000)
    assert.is_true(fence4 > fence2, fence4 .. " > " .. fence2)
    c:close()
  end)

  describe("waiting", function()
    it("gets the lock once the holder releases it", function()
      local holder = helpers.spawn(helpers.spec_dir .. "workers/hold.lua", srv.port, "w", 0.3)
      assert.is_truthy(helpers.eventually(3, function() return raw:command("EXISTS", "lock:{w}") == 1 end))
      local t0 = core.now()
      local lock, err = client:acquire("w", 5, { wait = 5 * helpers.slow })
      local waited = core.now() - t0
      assert.is_truthy(lock, err)
      assert.is_true(waited < 4 * helpers.slow, tostring(waited))
      local out, ok = holder.wait()
      assert.is_true(ok, out)
      assert.is_truthy(out:find("released", 1, true), out)
    end)

    it("gives up with busy when the wait runs out, not before", function()
      local other = srv:client()
      assert(other:acquire("w", 10))
      local t0 = core.now()
      local lock, err = client:acquire("w", 5, { wait = 0.3 })
      local waited = core.now() - t0
      assert.is_nil(lock)
      assert.is_truthy(err:match('^busy: "w" is still held by another owner after waiting 0.3 s'), err)
      assert.is_true(waited >= 0.3, tostring(waited))
      assert.is_true(waited < 0.3 + 0.5 * helpers.slow, tostring(waited))
      other:close()
    end)

    it("takes a lock soon after it expires rather than sleeping on", function()
      -- Backoff reaches 128 ms steps within 0.3 s; a sleep is cut to the
      -- holder's remaining time, so the lock is ours within a few ms of its
      -- expiry, where an uncut step would overshoot by up to 128 ms.
      local other = srv:client()
      assert(other:acquire("w", 1.5))
      local t0 = core.now()
      local lock = assert(client:acquire("w", 5, { wait = 3 }))
      local waited = core.now() - t0
      assert.is_truthy(lock.fence)
      assert.is_true(waited < 1.5 + 0.05 * helpers.slow, tostring(waited))
      other:close()
    end)
  end)

  describe("on a Redis Cluster node", function()
    -- One node holding every slot: a script whose keys fall on different
    -- slots fails there with CROSSSLOT, so this proves the shared hash tag.
    local node

    lazy_setup(function()
      node = helpers.start_redis({ "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf" },
                                 { cluster = true })
      local nraw = node:raw()
      assert.are.equal("OK", nraw:command("CLUSTER", "ADDSLOTSRANGE", "0", "16383"))
      assert.is_truthy(helpers.eventually(5, function()
        return (nraw:command("CLUSTER", "INFO") or ""):find("cluster_state:ok", 1, true)
      end))
      nraw:close()
    end)
    lazy_teardown(function() node:stop() end)

    it("runs every script, for keys with and without braces", function()
      local c = node:client()
      for _, key in ipairs({ "orders:42", "a{b}c", "{x}", "x}" }) do
        local lock, err = c:acquire(key, 5)
        assert.is_truthy(lock, err)
        assert.is_true(lock:extend(5))
        assert.is_truthy(lock:ttl())
        assert.is_true(lock:release())
        assert.are.equal("done", c:with_lock(key, 5, function() return "done" end))
      end
      c:close()
    end)
  end)

  it("takes and releases the common case in one call each, as the general path does", function()
    -- No options, one server, no observer: core.fast_take and
    -- core.fast_release; an options table takes the general path.
    local quick, general = assert(client:acquire("one", 5)), assert(client:acquire("two", 5, {}))
    -- The general path's locks release by Lock:release alone; a common
    -- case's lock by its own, which checks its call as Lock:release does.
    assert.is_function(rawget(quick, "release"))
    assert.is_nil(rawget(general, "release"))
    assert.has_error(function() quick.release(nil) end,
                     "bad self to 'release' (redislock lock expected, got nil; call it with ':', as x:release(...))")
    local shape = "^%x+(/[^/]+/%d+/)%d+$"
    assert.are.equal(general.token:match(shape), quick.token:match(shape), quick.token)
    assert.are.equal(32, #quick.token:match("^%x+"))
    assert.are.equal(quick.token, raw:command("GET", "lock:{one}"))
    assert.is_true(math.abs(quick._expires - quick._since - 5) < 1e-6 and quick._since <= general._since)
    assert.are.equal("held", quick._state)
    for _, lock in ipairs({ quick, general }) do
      assert.is_true(lock:release())
      assert.is_true(lock:release())
      assert.are.equal("released", lock._state)
    end
    local class = getmetatable(quick).__index
    local third = assert(client:acquire("three", 5))
    assert.is_true(class.release(third))
    assert.are.equal(0, raw:command("EXISTS", "lock:{three}"))
    assert.are.equal(0, raw:command("EXISTS", "lock:{one}", "lock:{two}"))
    -- The tail of the token (the second it was made in) follows the clock.
    local first = assert(client:acquire("one", 5))
    local t = os.time()
    assert.is_truthy(helpers.eventually(3, function() return os.time() > t end))
    local second = assert(client:acquire("two", 5))
    assert.is_true(tonumber(second.token:match("(%d+)$")) > tonumber(first.token:match("(%d+)$")), second.token)
    assert.is_true(first:release() and second:release())
    -- Lost, or its client closed: the general path's answers.
    local messages = {}
    for i, opts in ipairs({ false, {} }) do
      local lock = assert(client:acquire("short", 0.05, opts or nil))
      assert.are.equal(not opts, rawget(lock, "release") ~= nil)
      core.sleep(0.1)
      local none, err = lock:release()
      messages[i] = none == nil and err
    end
    assert.are.equal('lost: "short" is no longer ours (it expired or was deleted; found at release)', messages[1])
    assert.are.equal(messages[2], messages[1])
    local other = srv:client()
    local lock = assert(other:acquire("closed", 5))
    other:close()
    local none, err = lock:release()
    assert.is_nil(none)
    assert.are.equal('connection: the lock\'s client is closed; "closed" runs out by its TTL', err)
    assert.has_error(function() lock:release(nil) end,
                     "bad argument #1 to 'release' (no more than 0 arguments expected, got 1)")
  end)

  it("runs with_lock's common case in one call each way, as the general path does", function()
    -- A key, a TTL and a function: core.fast_with takes the lock and gives
    -- it to the watchdog, and its own release stops that first; an options
    -- table takes the general path. Each case runs both ways (opts false:
    -- the common case) and must come out the same.
    local function both(key, ttl, fn, new)
      local out = {}
      for i, opts in ipairs({ false, {} }) do
        local c = new and new() or client
        out[i] = table.pack(pcall(c.with_lock, c, key .. i, ttl, fn, opts or nil))
      end
      return out[1], out[2]
    end
    local seen = {}
    local quick, general = both("w", 5, function(lock)
      seen[#seen + 1] = lock
      assert.are.equal(lock.token, raw:command("GET", "lock:{" .. lock.key .. "}"))
      return "a", nil, lock._lease:state()
    end)
    assert.are.same({ true, "a", nil, "held", n = 4 }, quick)
    assert.are.same(quick, general)
    assert.is_function(rawget(seen[1], "release"))
    assert.is_nil(rawget(seen[2], "release"))
    local shape = "^%x+(/[^/]+/%d+/)%d+$"
    assert.are.equal(seen[2].token:match(shape), seen[1].token:match(shape), seen[1].token)
    for _, lock in ipairs(seen) do
      assert.are.equal("released", lock._state)
      assert.are.equal("ended", lock._lease:state()) -- stopped before the release
      assert.is_true(lock._expires > lock._since)
    end
    assert.are.equal(0, raw:command("EXISTS", "lock:{w1}", "lock:{w2}"))
    -- Renewed while fn runs past the TTL.
    quick, general = both("renewed", 0.3, function(lock)
      core.sleep(0.5)
      return raw:command("GET", "lock:{" .. lock.key .. "}") == lock.token
    end)
    assert.are.same({ true, true, n = 2 }, quick)
    assert.are.same(quick, general)
    -- fn raises: its own value, the lock released.
    local oops = {}
    quick, general = both("raises", 5, function() error(oops) end)
    assert.are.same({ false, oops, n = 2 }, quick)
    assert.are.equal(oops, quick[2])
    assert.are.equal(oops, general[2])
    assert.are.equal(0, raw:command("EXISTS", "lock:{raises1}", "lock:{raises2}"))
    -- Lost while fn ran, as its renewal found it: that is what comes out.
    quick, general = both("lost", 0.3, function(lock)
      raw:command("DEL", "lock:{" .. lock.key .. "}")
      assert(helpers.eventually(5, function() return lock._lease:state() == "lost" end))
    end)
    assert.is_false(quick[1])
    assert.is_truthy(quick[2]:match('^lost: "lost1" is no longer ours %('), quick[2])
    assert.are.equal(general[2], (quick[2]:gsub('"lost1"', '"lost2"')))
    -- Busy: the same message (but the time left).
    local other = srv:client()
    local held = { assert(other:acquire("busy1", 5)), assert(other:acquire("busy2", 5)) }
    quick, general = both("busy", 5, function() return "ran" end)
    assert.are.equal('busy: "busy1" is held by another owner (5 s left)', (quick[2]:gsub("%(%d[%d.]* s", "(5 s")))
    assert.are.equal(quick[2]:gsub("busy1", "busy2"):gsub("[%d.]+ s left", ""), general[2]:gsub("[%d.]+ s left", ""))
    for _, lock in ipairs(held) do assert.is_true(lock:release()) end
    -- Its client closed while fn ran: the general path's answer.
    other:close()
    quick, general = both("closed", 5, function() other:close() end, function()
      other = srv:client()
      return other
    end)
    assert.are.same({ false, 'connection: the lock\'s client is closed; "closed1" runs out by its TTL', n = 2 }, quick)
    assert.are.equal(quick[2]:gsub("closed1", "closed2"), general[2])
    -- Not the common case: a callable table, or more arguments.
    local callable = setmetatable({}, { __call = function() return "called" end })
    assert.are.equal("called", client:with_lock("callable", 5, callable))
    assert.has_error(function() client:with_lock("extra", 5, function() end, nil, 1) end,
                     "bad argument #5 to 'with_lock' (no more than 4 arguments expected, got 5)")
  end)
end)
