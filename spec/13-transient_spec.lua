-- SPDX-License-Identifier: MIT
-- run.sh: long 100 (its seconds on a loaded 2-core machine: spec/run.sh starts it early; make check skips it)
-- A restarting server is waited out, not reported: while a restarted
-- redis-server loads a data set (a second, or several on a busy machine) it answers -LOADING, and
-- acquire / with_lock with wait time left keep trying through it; with none
-- left they return the redis error. Renewal rides through it too.
local core = require("redislock.core")
local helpers = require("spec.helpers")

describe("a server that is loading its data set", function()
  local srv, client

  -- Enough keys that loading them takes about a second on a small machine.
  local KEYS = 3000000

  lazy_setup(function()
    srv = helpers.start_redis()
    assert.are.equal("OK", srv:cli("DEBUG", "POPULATE", tostring(KEYS)))
    assert.are.equal("OK", srv:cli("SAVE"))
  end)
  lazy_teardown(function()
    if srv then srv:stop() end
  end)
  before_each(function() client = srv:client() end)
  after_each(function() client:close() end)

  -- Restarts the server and returns once it answers LOADING, having checked
  -- that it does (else the spec would prove nothing).
  local function restart_loading()
    srv:restart()
    local probe = srv:raw()
    local _, err = probe:command("PING")
    probe:close()
    assert.is_truthy(err and err:match("^redis: LOADING"), "the restarted server was not loading: " .. tostring(err))
  end

  local function loaded()
    return helpers.eventually(30, function() return srv:cli("PING") == "PONG" end)
  end

  it("is waited out by acquire with wait", function()
    restart_loading()
    -- The wait outlasts the loading, which took over 5 s on a loaded machine.
    local lock, err = client:acquire("k", 5, { wait = 30 })
    assert.is_truthy(lock, err)
    assert.are.equal(lock.token, srv:cli("GET", "lock:{k}"))
    assert.is_true(lock:release())
  end)

  it("is waited out by with_lock with wait (poll mode too)", function()
    for _, mode in ipairs({ "notify", "poll" }) do
      restart_loading()
      local got = client:with_lock("w", 5, function(lock)
        return srv:cli("GET", "lock:{w}") == lock.token
      end, { wait = 30, wait_mode = mode })
      assert.is_true(got, mode)
      assert.are.equal("0", srv:cli("EXISTS", "lock:{w}"))
    end
  end)

  it("is reported as a redis error when there is no wait", function()
    restart_loading()
    local lock, err = client:acquire("k", 5)
    assert.is_nil(lock)
    assert.is_truthy(err:match("^redis: LOADING"), err)
    local ok, raised = pcall(client.with_lock, client, "k", 5, function() end)
    assert.is_false(ok)
    assert.is_truthy(raised:match("^redis: LOADING"), raised)
    assert.is_truthy(loaded())
  end)

  it("is reported when the wait runs out before the loading ends", function()
    restart_loading()
    local lock, err = client:acquire("k", 5, { wait = 0.1 })
    assert.is_nil(lock)
    assert.is_truthy(err:match("^redis: LOADING"), err)
    assert.is_truthy(loaded())
  end)

  it("does not end a renewed lock that the restart kept", function()
    assert.is_truthy(loaded())
    -- A TTL well over the loading's time (which was 7 s on a loaded machine).
    local lock = assert(client:acquire("kept", 30, { renew = true }))
    assert.are.equal("OK", srv:cli("SAVE")) -- the lock is in the data set now
    restart_loading()
    assert.is_truthy(loaded())
    -- A renewal after the loading (retried while it lasts) confirms the lock
    -- is ours: its TTL goes up, past what it would be left with unrenewed.
    local left, at = assert(tonumber(srv:cli("PTTL", "lock:{kept}"))), core.now()
    assert.is_true(left > 0, "the lock expired while the server loaded")
    local ttl = helpers.eventually(15, function()
      local ms = tonumber(srv:cli("PTTL", "lock:{kept}"))
      return ms and ms > left - (core.now() - at) * 1000 + 500 and ms
    end)
    assert.is_truthy(ttl, "the lock was not renewed after the restart")
    assert.is_true(lock:check())
    assert.is_true(lock:release())
  end)
end)
