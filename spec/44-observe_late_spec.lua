-- SPDX-License-Identifier: MIT
-- election:observe's options as docs/election.md gives them (issue 53,
-- item 10): `wait = 0` is taken, as acquire's (the leader told once, then
-- it returns); with `late`, an observer whose server stops answering (a
-- real redis-server, SIGSTOPped) gives up once nothing was heard for
-- `late` seconds, told within the client's timeout, not after several of
-- its timeouts (about 5 s for late = 1 before).
local core = require("redislock.core")
local helpers = require("spec.helpers")

describe("election:observe", function()
  local srv, client

  lazy_setup(function()
    srv = helpers.start_redis()
    client = srv:client({ timeout = 1 })
  end)
  lazy_teardown(function()
    if client then client:close() end
    if srv then
      os.execute("kill -CONT " .. srv.pid .. " 2>/dev/null")
      srv:stop()
    end
  end)

  it("takes wait = 0: tells the leader now, once, and returns", function()
    local e = client:election("obs:now")
    local heard = {}
    assert.is_true(e:observe(function(l) heard[#heard + 1] = l end, { wait = 0 }))
    assert.are.same({ false }, heard)
    local lead = assert(e:campaign("me", 5))
    heard = {}
    assert.is_true(e:observe(function(l) heard[#heard + 1] = l end, { wait = 0 }))
    assert.are.equal(1, #heard)
    assert.are.equal("me", heard[1].value)
    assert(lead:resign())
    assert.has_error(function() e:observe(function() end, { wait = -1 }) end)
  end)

  it("gives up about late seconds (and the timeout) after its server stopped answering", function()
    local e = client:election("obs:late")
    local t0
    local ok, err = e:observe(function()
      if not t0 then
        t0 = core.now()
        assert.is_true(helpers.sh_ok("kill -STOP " .. srv.pid))
      end
    end, { late = 1 })
    local took = core.now() - t0
    os.execute("kill -CONT " .. srv.pid)
    assert.is_nil(ok)
    assert.matches("^connection: ", err)
    -- late (1 s) and the client's timeout (1 s) to tell, with room for a
    -- loaded machine; three timeouts or more before
    assert.is_true(took >= 1, "gave up after " .. took .. " s, before late")
    assert.is_true(took < 2.8 * helpers.slow, "gave up after " .. took .. " s")
  end)
end)
