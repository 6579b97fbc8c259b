-- SPDX-License-Identifier: MIT
-- The semaphore, the read-write lock and the multi-key lock under
-- OpenResty: many requests at once in one real nginx of two workers
-- (helpers.start_primitive_nginx: spec/support/ngx_app.lua's primitive
-- handler), each hold renewed by the worker's timer. Plain Lua's cases are
-- in specs 23, 24 and 25.
local helpers = require("spec.helpers")

describe("the primitives under OpenResty", function()
  if helpers.no_nginx(pending) then return end

  local srv, raw, nginx

  helpers.redis_for(function(s, r)
    srv, raw = s, r
    nginx = helpers.start_primitive_nginx(srv)
  end, { flush = true })
  lazy_teardown(function() if nginx then nginx:stop() end end)
  before_each(function() raw:command("MSET", "readers", 0, "writers", 0, "overlaps", 0) end)

  -- The semaphore's permits.
  it("lets at most 3 of 200 concurrent requests hold a permit, and reaches 3", function()
    local paths = {}
    for i = 1, 200 do paths[i] = "/primitive?kind=sem&limit=3" end
    nginx:all_ok(paths)
    local seen = raw:command("LRANGE", "seen", 0, -1)
    assert.are.equal(200, #seen)
    local most = 0
    for _, n in ipairs(seen) do most = math.max(most, tonumber(n)) end
    assert.are.equal(3, most)
    assert.are.equal(0, raw:command("EXISTS", "lock:{pool}:permits"))
  end)

  it("renews permits with the worker's timer", function()
    nginx:all_ok({ "/primitive?kind=sem&limit=1&ttl=0.3&hold=1" })
  end)

  -- Read and write holds.
  it("lets readers overlap and writers overlap nothing under 200 concurrent requests", function()
    local paths = {}
    for i = 1, 200 do paths[i] = "/primitive?kind=" .. (i % 5 == 0 and "write" or "read") .. "&hold=0.005" end
    nginx:all_ok(paths)
    assert.are.equal("0", raw:command("GET", "overlaps"))
    assert.are.equal(0, raw:command("EXISTS", "lock:{doc}:rw:readers", "lock:{doc}:rw:writer"))
  end)

  it("renews read and write holds with the worker's timer", function()
    nginx:all_ok({ "/primitive?kind=read&ttl=0.3&hold=1" })
    nginx:all_ok({ "/primitive?kind=write&ttl=0.3&hold=1" })
  end)

  -- Multi-key locks.
  it("takes multi-key locks in opposite orders beside single locks: no deadlock, no overlap", function()
    local paths = {}
    for i = 1, 150 do
      paths[i] = "/primitive?kind=multi&keys=" .. ({ "a,b,c", "c,b,a", "b", "c,a" })[i % 4 + 1]
    end
    nginx:all_ok(paths)
    assert.are.equal("0", raw:command("GET", "overlaps"))
    assert.are.equal(0, raw:command("EXISTS", "lock:{a}", "lock:{b}", "lock:{c}"))
  end)

  it("renews every key's hold with the worker's timer", function()
    nginx:all_ok({ "/primitive?kind=multi&keys=x,y&ttl=0.3&hold=1" })
  end)
end)
