-- SPDX-License-Identifier: MIT
-- A release (and an extend) refused by a server state that passes is sent
-- again (redislock/lock.lua's again), while the lock may still be ours: a
-- busy script (BUSY) and a restart loading its data (LOADING) hold it up,
-- and the release lands once they are over; refusals that outlast the lock
-- end with the "redis" error, never a hang. A real redis-server, its state
-- made by real commands.
local core = require "redislock.core"
local helpers = require "spec.helpers"
local http = require "spec.support.http"

-- A script that keeps the server busy for about seconds (it answers BUSY to
-- others after busy-reply-threshold, 100 ms here), run by redis-cli in the
-- background. Returns once the server says BUSY.
local function busy(srv, raw, seconds)
  local script = "local function t() local x = redis.call('TIME') return x[1] + x[2] / 1e6 end "
                 .. "local s = t() while t() - s < " .. seconds .. " do end return 1"
  os.execute("redis-cli -p " .. srv.port .. " EVAL " .. helpers.sh_quote(script) .. " 0 >/dev/null 2>&1 &")
  assert(helpers.eventually(5, function()
    local _, err = raw:command("PING")
    return err and err:find("BUSY", 1, true)
  end), "the server never said BUSY")
end

describe("a release refused by a passing server state", function()
  local srv, raw, client

  lazy_setup(function()
    srv = helpers.start_redis({ "--busy-reply-threshold", "100" })
    raw = srv:raw()
    client = srv:client({ timeout = 5 })
  end)
  lazy_teardown(function()
    if client then client:close() end
    if raw then raw:close() end
    if srv then srv:stop() end
  end)

  it("is sent again while a script keeps the server busy, and lands when it ends", function()
    local lock = assert(client:acquire("refused:busy", 10))
    local extended = assert(client:acquire("refused:extend", 10))
    busy(srv, raw, 1)
    local t0 = core.now()
    assert.is_true(lock:release())
    assert.is_true(core.now() - t0 > 0.3, "released at once: was it refused at all?")
    assert.are.equal(0, raw:command("EXISTS", "lock:{refused:busy}"))
    busy(srv, raw, 1)
    assert.is_true(extended:extend(20))
    assert.is_true(raw:command("PTTL", "lock:{refused:extend}") > 10000)
    assert.is_true(extended:release())
  end)

  it("ends with the redis error when the refusals outlast the lock, and with_lock raises it", function()
    local lock = assert(client:acquire("refused:long", 0.5))
    busy(srv, raw, 2)
    local t0 = core.now()
    local ok, err = lock:release()
    local took = core.now() - t0
    assert.is_nil(ok)
    assert.matches("^redis: BUSY", err)
    assert.is_true(took < 1.5 * helpers.slow, "took " .. took .. " s") -- the lock's 0.5 s, not the script's 2 s
    assert(helpers.eventually(5, function() return raw:command("PING") == "PONG" end))
    -- Inside with_lock: fn's work succeeded, the release is retried, then raised.
    local raised = select(2, pcall(client.with_lock, client, "refused:scoped", 0.5, function()
      busy(srv, raw, 2)
    end, { renew = false }))
    assert.matches("^redis: BUSY", tostring(raised))
    assert(helpers.eventually(5, function() return raw:command("PING") == "PONG" end))
  end)

  it("is sent again while a restart loads the data set, and lands once it is loaded", function()
    -- About a second of loading: three million keys in the dump.
    assert.are.equal("OK", srv:cli("DEBUG", "POPULATE", "3000000")) -- redis-cli: no 1 s timeout
    local lock = assert(client:acquire("refused:loading", 30))
    assert.are.equal("OK", srv:cli("SAVE"))
    raw:close()
    srv:restart() -- back as soon as it listens, while it still loads
    raw = srv:raw()
    local _, loading = raw:command("PING")
    assert.matches("^redis: LOADING", tostring(loading)) -- still loading: the release is refused at first
    assert.is_true(lock:release())
    assert.are.equal(0, raw:command("EXISTS", "lock:{refused:loading}"))
    assert.are.equal("OK", srv:cli("FLUSHALL"))
  end)
end)

describe("OpenResty: with_lock's release refused by a busy script", function()
  if not jit then
    pending("runs in the LuaJIT pass of make test (nginx loads the LuaJIT build)")
    return
  end

  local srv, raw, nginx

  lazy_setup(function()
    srv = helpers.start_redis({ "--busy-reply-threshold", "100" })
    raw = srv:raw()
    nginx = helpers.start_nginx({
      workers = 1,
      http = table.concat({
        "server {",
        "  listen 127.0.0.1:{{port}};",
        '  set $redis_url "redis://127.0.0.1:' .. srv.port .. '";',
        '  set $redis_timeout "5";',
        "  location = /with_lock { content_by_lua_block { require('spec.support.ngx_app').with_lock() } }",
        "}",
      }, "\n"),
    })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
    if raw then raw:close() end
    if srv then srv:stop() end
  end)

  it("is sent again over cosockets, and lands when the script ends", function()
    -- fn holds the lock 0.5 s; the script keeps the server busy past that.
    local request = http.start(nginx.port, "GET", "/with_lock?key=refused:ngx&ttl=10&hold=0.5", { timeout = 30 })
    assert(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{refused:ngx}") == 1 end),
           "the request never took the lock") -- else the script could refuse the acquire itself
    busy(srv, raw, 1.5)
    local status, body = request:finish()
    assert.are.equal(200, status, body .. nginx:error_log())
    assert.are.equal(0, raw:command("EXISTS", "lock:{refused:ngx}"))
  end)
end)

describe("a release refused by a demoted master behind Sentinel", function()
  local g, q

  lazy_setup(function()
    g = helpers.start_sentinels()
    q = g:quiet_master() -- "quiet": old, watched by one sentinel; new beside it
  end)
  lazy_teardown(function()
    if q then q:stop() end
    if g then g:stop() end
  end)

  it("is sent again, and lands on the master the sentinels name then", function()
    assert.are.equal("OK", q.new:cli("REPLICAOF", "127.0.0.1", tostring(q.old.port)))
    local client = require("redislock").new({ sentinels = { q.addr }, master = "quiet", timeout = 1 })
    local lock = assert(client:acquire("refused:sentinel", 15))
    assert(helpers.eventually(10, function() return q.new:cli("EXISTS", "lock:{refused:sentinel}") == "1" end),
           "the lock never reached the replica")
    -- A switch without +switch-master: the replica is promoted, the old
    -- master made its replica, the sentinel told to watch the new one.
    -- Whether the release first meets the old master's READONLY (sent
    -- again) or the client asks the sentinel first, it lands on the new
    -- master. (BUSY and LOADING above are the refusals this spec forces.)
    for _, step in ipairs({ { q.sentinel, "SENTINEL", "REMOVE", "quiet" },
                            { q.new, "REPLICAOF", "NO", "ONE" },
                            { q.old, "REPLICAOF", "127.0.0.1", tostring(q.new.port) },
                            { q.sentinel, "SENTINEL", "MONITOR", "quiet", "127.0.0.1", tostring(q.new.port), "2" } }) do
      local unpack = table.unpack or unpack -- luacheck: ignore (LuaJIT's global)
      assert.are.equal("OK", step[1]:cli(unpack(step, 2)))
    end
    assert.is_true(lock:release())
    assert.are.equal("0", q.new:cli("EXISTS", "lock:{refused:sentinel}"))
    client:close()
  end)
end)
