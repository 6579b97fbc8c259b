-- SPDX-License-Identifier: MIT
-- Mutual exclusion across OS processes: 8 workers increment a shared Redis
-- counter by read-modify-write. With with_lock (waiting by notification, by
-- polling, or in a fair queue) no update is lost and no two
-- workers are ever inside at once; without it, updates are lost (so this spec
-- would fail if the lock did not exclude).
local core = require "redislock.core"
local helpers = require "spec.helpers"

local WORKERS, ROUNDS = 8, 40

describe("mutual exclusion across processes", function()
  local srv, raw

  helpers.redis_for(lazy_setup, lazy_teardown, function(s, r) srv, raw = s, r end)

  -- Runs the workers in `mode`; returns the final counter and the overlaps seen.
  local function race(mode)
    assert.are.equal("OK", raw:command("FLUSHALL"))
    assert.are.equal("OK", raw:command("SET", "counter", "0"))
    local start_at = core.now() + 0.5 * helpers.slow
    local procs = {}
    for i = 1, WORKERS do
      procs[i] = helpers.spawn(helpers.spec_dir .. "workers/counter.lua", srv.port, mode, ROUNDS, start_at)
    end
    local overlaps = helpers.overlaps(procs)
    return tonumber(raw:command("GET", "counter")), overlaps
  end

  it("loses updates without the lock (the race is real)", function()
    local counter, overlaps = race("nolock")
    assert.is_true(counter < WORKERS * ROUNDS, "counter " .. counter)
    assert.is_true(overlaps > 0)
  end)

  for _, mode in ipairs({ "notify", "poll", "fair" }) do
    it("loses none with with_lock (" .. mode .. "), and no two workers are ever inside at once", function()
      local counter, overlaps = race(mode)
      assert.are.equal(WORKERS * ROUNDS, counter)
      assert.are.equal(0, overlaps)
      -- Every section had a fence of its own, larger than the one before.
      local fences = raw:command("LRANGE", "fences", 0, -1)
      assert.are.equal(WORKERS * ROUNDS, #fences)
      for i = 2, #fences do
        local a, b = tonumber(fences[i - 1]), tonumber(fences[i])
        assert.is_true(b > a, "fence " .. b .. " after " .. a)
      end
      assert.are.equal(0, raw:command("EXISTS", "lock:{counter}"))
    end)
  end
end)
