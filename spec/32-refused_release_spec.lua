-- SPDX-License-Identifier: MIT
-- run.sh: long 100 (its seconds on a loaded 2-core machine: spec/run.sh starts it early; make check skips it)
-- A release (and an extend) refused by a server state that passes is sent
-- again (redislock/lock.lua's again), while the lock may still be ours: a
-- busy script (BUSY) and a restart loading its data (LOADING) hold it up,
-- and the release lands once they are over; refusals that outlast the lock
-- end with the "redis" error, never a hang. A real redis-server, its state
-- made by real commands.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")

-- A script that keeps the server (a Server) busy for about seconds, run by
-- redis-cli in the background; other clients get BUSY after 100 ms
-- (busy-reply-threshold, set here). Returns once the server says BUSY.
local function busy(srv, seconds)
  assert.are.equal("OK", srv:cli("CONFIG", "SET", "busy-reply-threshold", "100"))
  local script = "local function t() local x = redis.call('TIME') return x[1] + x[2] / 1e6 end "
                 .. "local s = t() while t() - s < " .. seconds .. " do end return 1"
  local cli = srv.password and "redis-cli --no-auth-warning -a " .. helpers.sh_quote(srv.password) or "redis-cli"
  os.execute(cli .. " -p " .. srv.port .. " EVAL " .. helpers.sh_quote(script) .. " 0 >/dev/null 2>&1 &")
  assert(helpers.eventually(5, function() return srv:cli("PING"):find("BUSY", 1, true) end),
         "the server never said BUSY")
end

-- Waits until the server (a Server) answers again.
local function idle(srv)
  assert(helpers.eventually(5, function() return srv:cli("PING") == "PONG" end), "the server stayed busy")
end

describe("a release refused by a passing server state", function()
  local srv, raw, client

  helpers.redis_for(function(s, r)
    srv, raw, client = s, r, s:client({ timeout = 5 })
  end)
  lazy_teardown(function()
    if client then client:close() end
  end)

  it("is sent again while a script keeps the server busy, and lands when it ends", function()
    local lock = assert(client:acquire("refused:busy", 10))
    local extended = assert(client:acquire("refused:extend", 10))
    busy(srv, 1)
    local t0 = core.now()
    assert.is_true(lock:release())
    assert.is_true(core.now() - t0 > 0.3, "released at once: was it refused at all?")
    assert.are.equal(0, raw:command("EXISTS", "lock:{refused:busy}"))
    busy(srv, 1)
    assert.is_true(extended:extend(20))
    assert.is_true(raw:command("PTTL", "lock:{refused:extend}") > 10000)
    assert.is_true(extended:release())
  end)

  it("is sent again for a semaphore's permit, a read-write lock's writer and a multi-key lock", function()
    local permit = assert(client:semaphore("refused:pool", 2):acquire(10))
    local writer = assert(client:rwlock("refused:doc"):write(10))
    local multi = assert(client:acquire({ "refused:a", "refused:b" }, 10))
    busy(srv, 1)
    local t0 = core.now()
    assert.is_true(permit:release())
    assert.is_true(core.now() - t0 > 0.3, "released at once: was it refused at all?")
    assert.is_true(writer:release())
    assert.is_true(multi:release())
    assert.are.equal(0, raw:command("ZCARD", "lock:{refused:pool}:permits"))
    assert.are.equal(0, raw:command("EXISTS", "lock:{refused:a}", "lock:{refused:b}"))
    assert(client:rwlock("refused:doc"):write(1, { wait = 0 })):release()
  end)

  it("ends with the redis error when the refusals outlast the lock, and with_lock raises it", function()
    local lock = assert(client:acquire("refused:long", 0.5))
    busy(srv, 2)
    local t0 = core.now()
    local ok, err = lock:release()
    local took = core.now() - t0
    assert.is_nil(ok)
    assert.matches("^redis: BUSY", err)
    assert.is_true(took < 1.5 * helpers.slow, "took " .. took .. " s") -- the lock's 0.5 s, not the script's 2 s
    idle(srv)
    -- Inside with_lock: fn's work succeeded, the release is retried, then raised.
    local raised = select(2, pcall(client.with_lock, client, "refused:scoped", 0.5, function()
      busy(srv, 2)
    end, { renew = false }))
    assert.matches("^redis: BUSY", tostring(raised))
    idle(srv)
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
  if helpers.no_nginx(pending) then return end

  local srv, raw, nginx, servers

  helpers.redis_for(function(s, r) srv, raw = s, r end)
  lazy_setup(function()
    local urls
    servers, urls = helpers.start_redlock(3)
    nginx = helpers.start_nginx({
      workers = 1,
      server = {
        helpers.redis_vars(srv, 5),
        helpers.location("/with_lock", "with_lock"),
        helpers.location("/leave", "leave"),
        helpers.location("/redlock", "with_lock", 'set $redis_redlock "' .. urls .. '";'),
      },
    })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
    for _, s in ipairs(servers or {}) do s:stop() end
  end)

  it("is sent again over cosockets, and lands when the script ends", function()
    -- fn holds the lock 0.5 s; the script keeps the server busy past that.
    local request = http.start(nginx.port, "GET", "/with_lock?key=refused:ngx&ttl=10&hold=0.5", { timeout = 30 })
    assert(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{refused:ngx}") == 1 end),
           "the request never took the lock") -- else the script could refuse the acquire itself
    busy(srv, 1.5)
    local status, body = request:finish()
    assert.are.equal(200, status, body .. nginx:error_log())
    assert.are.equal(0, raw:command("EXISTS", "lock:{refused:ngx}"))
  end)

  it("is sent again by the renewal timer for a request that ended inside with_lock, before the TTL", function()
    -- The timer finds the request gone at the next renewal, a third of the
    -- TTL (1 s) in, while the script keeps the server busy (to about 2 s);
    -- refused then and not sent again, the lock would last its 3 s.
    local started = core.now()
    local status, body = http.request(nginx.port, "GET", "/leave?key=refused:left&ttl=3&how=exit")
    assert.are.equal(200, status, body)
    busy(srv, 2)
    assert.is_true(core.now() - started < 0.9, "the script started too late to meet the timer's release")
    idle(srv)
    local gone = helpers.eventually(3, function() return raw:command("EXISTS", "lock:{refused:left}") == 0 end)
    local took = core.now() - started
    assert.is_truthy(gone, "the lock was never released")
    assert.is_true(took < 2.8, string.format("gone only after %.2f s: it ran out by its TTL", took))
    assert.is_nil(nginx:error_log():find("cannot release", 1, true), nginx:error_log())
  end)

  it("is asked again of the Redlock servers that refused it, over cosockets", function()
    local request = http.start(nginx.port, "GET", "/redlock?key=refused:ngx:redlock&ttl=10&hold=0.5", { timeout = 30 })
    assert(helpers.eventually(5, function()
      return servers[3]:cli("EXISTS", "lock:{refused:ngx:redlock}") == "1"
    end), "the request never took the lock")
    busy(servers[1], 1.5)
    busy(servers[2], 1.5)
    local status, body = request:finish()
    assert.are.equal(200, status, body .. nginx:error_log())
    idle(servers[1])
    idle(servers[2])
    local left = 0
    for _, s in ipairs(servers) do left = left + tonumber(s:cli("EXISTS", "lock:{refused:ngx:redlock}")) end
    assert.is_true(left <= 1, "still held on " .. left .. " servers")
  end)
end)

describe("a Redlock release refused by a majority's passing state", function()
  local servers, list

  lazy_setup(function()
    local urls
    servers, urls = helpers.start_redlock(3)
    list = {}
    for u in urls:gmatch("[^,]+") do list[#list + 1] = u end
  end)
  lazy_teardown(function()
    for _, s in ipairs(servers or {}) do s:stop() end
  end)

  local function on_all(key)
    local n = 0
    for _, s in ipairs(servers) do n = n + tonumber(s:cli("EXISTS", "lock:{" .. key .. "}")) end
    return n
  end

  it("asks those servers again, and lands when they answer", function()
    local client = require("redislock").new({ redlock = list })
    local lock = assert(client:acquire("refused:redlock", 10))
    local extended = assert(client:acquire("refused:redlock:extend", 10))
    busy(servers[1], 1)
    busy(servers[2], 1)
    local t0 = core.now()
    assert.is_true(lock:release())
    assert.is_true(core.now() - t0 > 0.3, "released at once: was it refused at all?")
    -- Released on a majority (one server may still be busy, and keep it to
    -- its TTL): free for another holder.
    idle(servers[2])
    assert.is_true(on_all("refused:redlock") <= 1)
    assert(client:acquire("refused:redlock", 1)):release()
    busy(servers[2], 1)
    busy(servers[3], 1)
    assert.is_true(extended:extend(20))
    idle(servers[3])
    local longer = 0
    for _, s in ipairs(servers) do
      if tonumber(s:cli("PTTL", "lock:{refused:redlock:extend}")) > 10000 then longer = longer + 1 end
    end
    assert.is_true(longer >= 2, "extended on " .. longer .. " servers")
    assert.is_true(extended:release())
    client:close()
  end)

  it("ends with the error naming the refusals when they outlast the lock", function()
    local client = require("redislock").new({ redlock = list })
    local lock = assert(client:acquire("refused:redlock:long", 0.5))
    busy(servers[1], 2)
    busy(servers[3], 2)
    local t0 = core.now()
    local ok, err = lock:release()
    local took = core.now() - t0
    assert.is_nil(ok)
    assert.matches("^connection: reached 1 of 3 Redlock servers.*BUSY", err)
    assert.is_true(took < 1.5 * helpers.slow, "took " .. took .. " s")
    idle(servers[1])
    idle(servers[3])
    client:close()
  end)
end)

describe("a cluster release refused by its node's passing state", function()
  local cl

  lazy_setup(function() cl = helpers.start_cluster({ masters = 3, replicas = 0 }) end)
  lazy_teardown(function() if cl then cl:stop() end end)

  it("is sent again, and lands when the node answers", function()
    local client = require("redislock").new({ cluster = cl.seeds })
    local lock = assert(client:acquire("refused:cluster", 10))
    local owner = cl:owner(core.lock_slot("refused:cluster"))
    busy(owner, 1)
    local t0 = core.now()
    assert.is_true(lock:release())
    assert.is_true(core.now() - t0 > 0.3, "released at once: was it refused at all?")
    assert.are.equal("0", owner:cli("EXISTS", "lock:{refused:cluster}"))
    client:close()
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
