-- SPDX-License-Identifier: MIT
-- A hold's lease as redislock/lease.lua composes it: an owner's extend
-- after max_hold ended the renewals is its expiry (check() does not say
-- the TTL ran out while the lock is held); a Redlock lock's lease is held
-- while a majority of its servers' leases are, and expires by the
-- majority's less the drift.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local lease = require("redislock.lease")
local redislock = require("redislock")

local slow = helpers.slow

describe("a hold's lease", function()
  local client

  helpers.client_each(function(_, _, c) client = c end)

  it("takes the owner's extend after max_hold ended the renewals as its expiry", function()
    -- The renewal due a third of the TTL in comes after max_hold: it ends
    -- the lease instead. Extended after that, the lock is held past its
    -- first TTL, and check() says so.
    local lock = assert(client:acquire("capped", 1 * slow, { renew = true, max_hold = 0.1 * slow }))
    core.sleep(0.6 * slow)
    assert.is_true(lock:extend(2 * slow))
    core.sleep(0.6 * slow) -- past the first TTL
    local ok, err = lock:check()
    assert.is_true(ok, err)
    local left = assert(lock:ttl())
    assert.is_true(left > 0.5 * slow, "ttl " .. left)
    assert.is_true(lock:release())
  end)

  it("is its node's lease for one server, renewed past the TTL, ended by the release", function()
    local lock = assert(client:acquire("one", 0.3 * slow, { renew = true }))
    local l = lock._lease
    assert.is_nil(l.nodes)
    assert.are.equal("held", l:state())
    assert.is_false(lease.watchable(lock)) -- no on_lost
    core.sleep(0.5 * slow) -- renewed past its TTL
    assert.is_true(lock:check())
    assert.is_true(lock:release())
    assert.are.equal("ended", l:state())
  end)

  describe("over Redlock", function()
    local servers, nodes_client

    lazy_setup(function()
      servers = helpers.start_redlock(5)
      local urls = {}
      for i, s in ipairs(servers) do urls[i] = s.url end
      nodes_client = redislock.new({ redlock = urls, timeout = 1 })
    end)
    lazy_teardown(function()
      if nodes_client then nodes_client:close() end
      if servers then
        for _, s in ipairs(servers) do
          helpers.sh_ok("kill -CONT " .. s.pid .. " 2>/dev/null")
          s:stop()
        end
      end
    end)

    it("keeps its expiry once stopped, and a lock with a stopped lease is still released", function()
      -- A stopped node lease of the watchdog's knows no expiry any more;
      -- the hold's stays what it was when it stopped (not 0 less the drift).
      local lock = assert(nodes_client:acquire("stopped", 5 * slow, { renew = true }))
      local at = lock._lease:stop()
      assert.is_true(at > core.now() + 4 * slow, tostring(at))
      assert.are.equal(at, lock._lease:expires())
      assert.are.equal(at, (lock._lease:stop()))
      local ok, err = lock:check()
      assert.is_true(ok, err)
      assert.is_true(lock:release())
    end)

    it("is held while a majority of the servers' leases are, and lost after", function()
      local lock = assert(nodes_client:acquire("maj", 0.6 * slow, { renew = true }))
      local l = lock._lease
      assert.are.equal(5, #l.nodes)
      assert.are.equal(3, l.quorum)
      -- The majority's expiry, less the drift (1 % + 2 ms).
      local at = {}
      for i, n in ipairs(l.nodes) do at[i] = n:expires() end
      table.sort(at, function(a, b) return a > b end)
      assert.is_true(math.abs(l:expires() - (at[3] - (math.floor(600 * slow / 100) + 2) / 1000)) < 1e-9)
      -- Two servers lose it: still held by the other three.
      for i = 1, 2 do servers[i]:cli("DEL", "lock:{maj}") end
      core.sleep(0.5 * slow)
      assert.is_true(lock:check())
      -- A third: lost, with the sentence that says so.
      servers[3]:cli("DEL", "lock:{maj}")
      assert.is_truthy(helpers.eventually(2 * slow, function() return l:state() == "lost" end))
      local ok, err = lock:check()
      assert.is_nil(ok)
      assert.is_truthy(err:find("fewer than 3 of 5 Redlock servers still hold it", 1, true), err)
    end)
  end)
end)

describe("a Redlock hold's lease under OpenResty", function()
  if helpers.no_nginx(pending) then return end
  local http = require("spec.support.http")
  local servers, nginx

  lazy_setup(function()
    local urls
    servers, urls = helpers.start_redlock(3)
    nginx = helpers.start_nginx({
      workers = 1,
      http = "lua_socket_log_errors off;",
      server = { 'set $redis_redlock "' .. urls .. '";', helpers.location("/leave", "leave") },
    })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
    for _, s in ipairs(servers or {}) do s:stop() end
  end)

  it("gives the lock back when its request ends inside with_lock after the first server's lease was lost", function()
    -- The first server's node lease carries the request's sentinel. Its
    -- server stopped, that lease is lost once the TTL (1.5 s) runs out,
    -- while the other two keep the hold. The request then ends without
    -- unwinding (ngx.exit, 3.5 s in): the next renewal due finds it gone
    -- and gives the lock back, where it would renew it for ever.
    local key = "lock:{left:redlock}"
    local request = http.start(nginx.port, "GET", "/leave?key=left:redlock&ttl=1.5&how=exit&hold=3.5",
                               { timeout = 30 })
    assert.is_truthy(helpers.eventually(5, function() return servers[1]:cli("EXISTS", key) == "1" end),
                     "the request never took the lock")
    local t0 = core.now()
    servers[1]:stop()
    core.sleep(math.max(0, t0 + 2.8 - core.now()))
    assert.are.equal("1", servers[2]:cli("EXISTS", key), "the hold ended before its request did")
    assert.are.equal("1", servers[3]:cli("EXISTS", key), "the hold ended before its request did")
    local status, body = request:finish()
    assert.are.equal(200, status, body)
    local gone = helpers.eventually(1.5, function()
      return servers[2]:cli("EXISTS", key) == "0" and servers[3]:cli("EXISTS", key) == "0"
    end)
    assert.is_truthy(gone, "still held after its request ended" .. nginx:error_log())
  end)
end)
