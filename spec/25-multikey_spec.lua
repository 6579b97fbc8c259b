-- SPDX-License-Identifier: MIT
-- The multi-key lock (redislock/multilock.lua) on one server: all keys or
-- none, in one script; callers naming the keys in opposite orders never
-- deadlock and never overlap, with each other or with single locks on the
-- same keys; release frees all and wakes a waiter; bad arguments raise.
-- Under OpenResty: spec/50.
local core = require("redislock.core")
local helpers = require("spec.helpers")

describe("multi-key lock", function()
  local srv, raw, client

  helpers.client_for(function(s, r, c) srv, raw, client = s, r, c end)

  it("never deadlocks nor overlaps: keys in opposite orders, and single locks beside them", function()
    local start_at = core.now() + 0.5 * helpers.slow
    local procs = {}
    for _ = 1, 3 do procs[#procs + 1] = helpers.spawn_primitive(srv.port, "multi", start_at, "a,b,c", 15) end
    for _ = 1, 3 do procs[#procs + 1] = helpers.spawn_primitive(srv.port, "multi", start_at, "c,b,a", 15) end
    procs[#procs + 1] = helpers.spawn_primitive(srv.port, "multi", start_at, "b", 15)
    procs[#procs + 1] = helpers.spawn_primitive(srv.port, "multi", start_at, "c,a", 15)
    assert.are.equal(0, helpers.overlaps(procs))
    assert.are.equal(0, raw:command("EXISTS", "lock:{a}", "lock:{b}", "lock:{c}"))
  end)

  it("takes all keys or none", function()
    local b = assert(client:acquire("b", 5))
    local lock, err = client:acquire({ "a", "b", "c" }, 5)
    assert.is_nil(lock)
    assert.matches('^busy: "b" is held by this client', err)
    assert.are.equal(0, raw:command("EXISTS", "lock:{a}", "lock:{c}"))
    assert(b:release())
    lock = assert(client:acquire({ "c", "a", "b" }, 5))
    assert.are.same({ "c", "a", "b" }, lock.key)
    local token = lock.token
    for i, key in ipairs(lock.key) do
      assert.are.equal(token, raw:command("GET", "lock:{" .. key .. "}"))
      assert.are.equal(lock.fence[i], tonumber(raw:command("GET", "lock:{" .. key .. "}:fence")))
    end
    local left = assert(lock:ttl())
    assert.is_true(left > 4 and left <= 5)
    assert.is_true(lock:extend(10))
    assert.is_true(lock:ttl() > 9)
    assert.is_true(lock:check(true))
    assert.is_true(lock:release())
    assert.is_true(lock:release())
    assert.are.equal(0, raw:command("EXISTS", "lock:{a}", "lock:{b}", "lock:{c}"))
    assert.matches('^redislock multi%-key lock {"c", "a", "b"}$', tostring(lock))
  end)

  it("takes hundreds of keys in one script (their names made by the core)", function()
    local keys = {}
    for i = 1, 300 do keys[i] = "many:" .. i end
    local lock = assert(client:acquire(keys, 5))
    assert.are.equal(300, #lock.fence)
    for _, k in ipairs(keys) do assert.are.equal(lock.token, raw:command("GET", "lock:{" .. k .. "}")) end
    assert.is_true(lock:release())
    assert.are.equal(0, raw:command("EXISTS", "lock:{many:1}", "lock:{many:300}"))
  end)

  it("waits for a busy key, and is woken by its release", function()
    local other = srv:client()
    local b = assert(other:acquire("b", 10))
    local waiter = helpers.spawn_primitive(srv.port, "multi", core.now(), "a,b", 1)
    assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{b}:waiters") == 1 end))
    core.sleep(0.2)
    assert.are.equal(0, raw:command("EXISTS", "lock:{a}")) -- it holds nothing while it waits
    local t0 = core.now()
    assert(b:release())
    local out, ok = waiter.wait()
    assert.is_true(ok, out)
    assert.is_true(core.now() - t0 < 0.5 * helpers.slow, "not woken by the release")
    other:close()
  end)

  it("with_lock holds every key while fn runs, and reports a lost one", function()
    local keys = client:with_lock({ "x", "y" }, 5, function(lock)
      assert.are.equal(2, raw:command("EXISTS", "lock:{x}", "lock:{y}"))
      return lock.key
    end)
    assert.are.same({ "x", "y" }, keys)
    assert.are.equal(0, raw:command("EXISTS", "lock:{x}", "lock:{y}"))
    local ok, err = pcall(client.with_lock, client, { "x", "y" }, 5, function()
      raw:command("DEL", "lock:{y}")
    end)
    assert.is_false(ok)
    assert.matches('^lost: "y" is no longer ours', err)
    assert.are.equal(0, raw:command("EXISTS", "lock:{x}"))
    local value = {}
    ok, err = pcall(client.with_lock, client, { "x", "y" }, 5, function() error(value) end)
    assert.is_false(ok)
    assert.are.equal(value, err)
    -- renewed like a lock
    client:with_lock({ "x", "y" }, 0.3, function(lock)
      core.sleep(0.9)
      assert.is_true(lock:check(true))
    end)
  end)

  it("raises on bad arguments", function()
    assert.has_error(function() client:acquire({}, 5) end,
                     "bad argument #1 to 'acquire' (a list of 1 to 1000 keys expected, got 0)")
    assert.has_error(function() client:acquire({ "a", "a" }, 5) end,
                     "bad argument #1 to 'acquire' (key \"a\" appears twice)")
    assert.has_error(function() client:acquire({ "a", 2 }, 5) end,
                     "bad argument #1 to 'acquire' (keys[2] must be a string, got number)")
    assert.has_error(function() client:acquire({ "a", "" }, 5) end,
                     "bad argument #1 to 'acquire' (keys[2]: key must not be empty)")
    assert.has_error(function() client:acquire({ "a", x = "b" }, 5) end)
    assert.has_error(function() client:acquire({ "a", "b" }, 5, { fair = true }) end,
                     "bad argument #3 to 'acquire' (option 'fair' is not available for a multi-key lock"
                       .. " (a fair queue belongs to one key))")
    assert.has_error(function() client:acquire({ "a", "b" }, 5, { replicas = 1 }) end)
    assert.has_error(function() client:with_lock({ "a" }, 5) end)
    local many = {}
    for i = 1, 1001 do many[i] = "k" .. i end
    assert.has_error(function() client:acquire(many, 5) end)
  end)
end)
