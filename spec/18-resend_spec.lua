-- SPDX-License-Identifier: MIT
-- The mid-command resend path, forced: a proxy (spec/workers/drop_proxy.lua)
-- forwards a lock command to a real redis-server and closes the client's
-- connection before the reply, so the command ran and its answer is lost
-- (what a failover or a network cut mid-command does). An acquire's first
-- try, a take (MULTI, SET NX PX, XADD of the slot's fence record, EXEC),
-- is then followed by the acquire script, which reconciles by its token
-- (taken once; its fence a new one, above the one the lost take's ID
-- stood for, which nobody saw), never by a second take; a
-- release is never sent twice, and the next one finds it done. Plain Lua,
-- and (LuaJIT pass) OpenResty in a real nginx.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local redislock = require("redislock")

describe("a command whose reply is lost", function()
  local srv, raw

  helpers.redis_for(function(s, r) srv, raw = s, r end, { flush = true })

  -- Starts a proxy to the server that drops the reply to the first write
  -- containing marker, for the running test; returns its port and a
  -- function that stops it and returns how many it dropped and the first
  -- the replies it dropped (nil when none; see drop_proxy.lua). The
  -- acquire script is loaded first: the resend runs it (no NOSCRIPT).
  local function proxy(marker)
    assert.are.equal(core.scripts.acquire.sha, raw:command("SCRIPT", "LOAD", core.scripts.acquire.text))
    local port, stop_proxy = helpers.start_proxy("drop_proxy", srv.port, marker)
    local dropped, lost
    local function stop()
      if dropped == nil then
        local out, ok = stop_proxy()
        assert.is_true(ok, out)
        dropped = tonumber(out:match("dropped (%d+)"))
        lost = out:match("\nlost ([^\n]*)")
      end
      return dropped, lost
    end
    finally(stop) -- also when the test fails before it stops the proxy
    return port, stop
  end

  -- Asserts that the lost replies were a take's that took the lock (SET's
  -- +OK, then the record's new ID "<ms>-<seq>"), and that lock holds key
  -- with a fence above the one that ID stood for (helpers.id_fence), which is
  -- its holder's fence (a script's grant: the acquire script took the
  -- lock over) and the slot's last: no second take, no second grant.
  local function reconciled(lock, key, lost)
    local ms, seq = assert(lost, "no reply was dropped"):match("^%+OK %+QUEUED %+QUEUED %*2 %+OK %$%d+ (%d+)%-(%d+)$")
    assert.is_truthy(ms, lost)
    local lost_fence = helpers.id_fence(tonumber(ms), tonumber(seq))
    assert.is_true(lock.fence > lost_fence, lock.fence .. " > " .. lost_fence)
    assert.are.equal(lock.token, raw:command("GET", "lock:{" .. key .. "}"))
    assert.are.equal(tostring(lock.fence), raw:command("GET", "lock:{" .. key .. "}:fence"))
    assert.are.equal(lock.fence, select(2, helpers.fence_record(raw, key)))
  end

  it("reconciles an acquire whose reply was lost on a reused connection: taken once, a new fence", function()
    local port, stop = proxy("lost:a")
    local c = redislock.new({ port = port })
    assert.are.equal("PONG", c:command("PING")) -- the connection is reused next
    local lock = assert(c:acquire("lost:a", 5)) -- try once: the transport reconciles by itself
    local dropped, lost = stop()
    assert.are.equal(1, dropped)
    reconciled(lock, "lost:a", lost)
    assert.is_true(srv:client():from_token("lost:a", lock.token):release()) -- the proxy is gone
    assert.are.equal(0, raw:command("EXISTS", "lock:{lost:a}", "lock:{lost:a}:fence"))
    c:close()
  end)

  it("reconciles it within the wait on a fresh connection too", function()
    local port, stop = proxy("lost:b")
    local c = redislock.new({ port = port })
    local lock = assert(c:acquire("lost:b", 5, { wait = 2 }))
    local dropped, lost = stop()
    assert.are.equal(1, dropped)
    reconciled(lock, "lost:b", lost)
    c:close()
  end)

  it("says connection when it cannot reconcile (a fresh connection, no wait): the lock runs out by its TTL", function()
    local port, stop = proxy("lost:c")
    local c = redislock.new({ port = port })
    local lock, err = c:acquire("lost:c", 5)
    assert.are.equal(1, stop())
    assert.is_nil(lock)
    assert.matches("^connection: ", err)
    local pttl = raw:command("PTTL", "lock:{lost:c}")
    assert.is_true(pttl > 0 and pttl <= 5000, "PTTL " .. tostring(pttl))
    c:close()
  end)

  it("never sends a release twice: the lost one landed, and the next says so", function()
    assert.are.equal(0, raw:eval("release", "lost:none", core.token())) -- the script is loaded: it runs
    local port, stop = proxy(core.scripts.release.sha)
    local c = redislock.new({ port = port })
    local lock = assert(c:acquire("lost:r", 5))
    local ok, err = lock:release()
    assert.are.equal(1, stop())
    assert.is_nil(ok)
    assert.matches("^connection: ", err)
    assert.are.equal(0, raw:command("EXISTS", "lock:{lost:r}"))
    c:close()
    -- Through another client (the proxy is gone): the lock says it was released.
    local lock2 = srv:client():from_token("lost:r", lock.token)
    local again, err2 = lock2:release()
    assert.is_nil(again)
    assert.matches("^lost: ", err2)
  end)

  describe("under OpenResty", function()
    if helpers.no_nginx(pending) then return end
    local http = require("spec.support.http")

    it("reconciles an acquire whose reply was lost, and a with_lock goes on", function()
      local port, stop = proxy("lost:n")
      local nginx = helpers.start_nginx({
        workers = 1,
        http = "lua_socket_log_errors off;",
        server = { 'set $redis_url "redis://127.0.0.1:' .. port .. '";', helpers.location("/acquire", "acquire") },
      })
      finally(function() nginx:stop() end)
      -- A first request leaves a connection in the pool: the next one reuses it.
      local status, body = http.request(nginx.port, "GET", "/acquire?key=warm&ttl=1")
      assert.are.equal(200, status, body)
      status, body = http.request(nginx.port, "GET", "/acquire?key=lost:n&ttl=5&wait=2")
      assert.are.equal(200, status, body .. nginx:error_log())
      local dropped, lost = stop()
      assert.are.equal(1, dropped)
      local fence, token = body:match("^(%d+) (%S+)")
      reconciled({ fence = tonumber(fence), token = token }, "lost:n", lost)
    end)
  end)
end)
