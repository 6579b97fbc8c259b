-- SPDX-License-Identifier: MIT
-- A release cut off midway (issue 53, item 16; redis-py issue 3847 shipped
-- the opposite: a cancelled release cleared its token first, and the key
-- stayed held until deleted by hand) leaves the lock either released, or
-- still owned by the handle, which can release it: never held by nobody
-- until its TTL. Under OpenResty, the only runtime where a release can be
-- stopped between its send and its answer (in plain Lua it is one blocking
-- call that no coroutine can leave): ngx.thread.kill of the light thread
-- inside release, once while its reply is awaited (DEBUG SLEEP holds the
-- server), once in the pause between tries of a release refused as BUSY.
-- And the worker's next acquire of the key is not held up.
local helpers = require("spec.helpers")
local http = require("spec.support.http")

describe("OpenResty: a release whose light thread is killed midway", function()
  if helpers.no_nginx(pending) then return end

  local srv, raw, nginx

  helpers.redis_for(function(s, r) srv, raw = s, r end)
  lazy_setup(function()
    nginx = helpers.start_nginx({
      workers = 1,
      server = {
        helpers.redis_vars(srv, 5),
        helpers.location("/cut_release", "cut_release"),
      },
    })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
  end)

  -- Runs /cut_release on key while how(srv) holds the server up once the
  -- request took the lock; returns the handler's words. The release starts
  -- 1.5 s after the acquire, and how holds the server up 3 s: on a loaded
  -- machine how may start late (a redis-cli to start), and the release must
  -- still meet the server held up, until after its kill 0.2 s in.
  local function cut(key, how)
    local request = http.start(nginx.port, "GET", "/cut_release?key=" .. key .. "&wait=1.5&cut=0.2", { timeout = 30 })
    assert(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{" .. key .. "}") == 1 end),
           "the request never took the lock")
    how()
    local status, body = request:finish()
    assert.are.equal(200, status, body .. nginx:error_log())
    local exists, ok, err, again = body:match("^(%d) (%S+) (.-) (%S+)\n$")
    assert.is_truthy(exists, body)
    return tonumber(exists), ok, err, again
  end

  it("while its answer is awaited: the release lands, and the handle says so", function()
    local exists, ok, err, again = cut("cut:await", function()
      os.execute("redis-cli -p " .. srv.port .. " DEBUG SLEEP 3 >/dev/null 2>&1 &")
    end)
    -- Sent before the kill; whether the server ran it once awake depends on
    -- how the killed thread's connection was closed. Either way nothing is
    -- held by nobody: released, or the handle's second release takes it.
    if exists == 1 then
      assert.are.equal("true", ok, err)
    else
      assert.are.equal("nil", ok)
      assert.matches("^lost: ", err)
    end
    assert.are.equal("again", again)
    assert.are.equal(0, raw:command("EXISTS", "lock:{cut:await}"))
  end)

  it("in its pause between tries refused as BUSY: the handle still owns the lock and releases it", function()
    local exists, ok, err, again = cut("cut:busy", function()
      assert.are.equal("OK", srv:cli("CONFIG", "SET", "busy-reply-threshold", "100"))
      local script = "local function t() local x = redis.call('TIME') return x[1] + x[2] / 1e6 end "
                     .. "local s = t() while t() - s < 3 do end return 1"
      os.execute("redis-cli -p " .. srv.port .. " EVAL " .. helpers.sh_quote(script) .. " 0 >/dev/null 2>&1 &")
      assert(helpers.eventually(5, function() return srv:cli("PING"):find("BUSY", 1, true) end))
    end)
    if exists == 1 then
      assert.are.equal("true", ok, err) -- still ours: the second release takes it back
    else
      assert.are.equal("nil", ok)
      assert.matches("^lost: ", err)
    end
    assert.are.equal("again", again)
    assert.are.equal(0, raw:command("EXISTS", "lock:{cut:busy}"))
  end)
end)
