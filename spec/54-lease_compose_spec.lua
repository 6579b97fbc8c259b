-- SPDX-License-Identifier: MIT
-- A hold's lease as redislock/lease.lua composes it: an owner's extend
-- after max_hold ended the renewals is its expiry (check() does not say
-- the TTL ran out while the lock is held); a Redlock lock's lease is held
-- while a majority of its servers' leases are, and expires by the
-- majority's less the drift.
local core = require "redislock.core"
local helpers = require "spec.helpers"
local lease = require "redislock.lease"
local redislock = require "redislock"

local slow = helpers.slow

describe("a hold's lease", function()
  local srv, raw, client

  helpers.redis_for(lazy_setup, lazy_teardown, function(s, r) srv, raw = s, r end)
  before_each(function()
    assert.are.equal("OK", raw:command("FLUSHALL"))
    client = srv:client()
  end)
  after_each(function() client:close() end)

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
