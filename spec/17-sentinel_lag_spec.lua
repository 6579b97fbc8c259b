-- SPDX-License-Identifier: MIT
-- run.sh: long 60 (its seconds on a loaded 2-core machine: spec/run.sh starts it early; make check skips it)
-- Behind Sentinel, once the client's watch heard +switch-master, no lock is
-- taken on the demoted master, even when the sentinel the client asks first
-- has not heard of the switch and names the old master, which still says
-- ROLE master. A real group (spec/helpers/sentinel.lua), each process on
-- a loopback address of its own, is cut in two with iptables: the master
-- and the first sentinel on one side, the replica and the two others on
-- the other, where a failover promotes the replica. Nothing here is a
-- race: as long as the cut lasts, the first sentinel cannot learn of the
-- switch (sentinels learn from each other's hello messages, every 2 s,
-- through the nodes or directly), and nobody can reconfigure the old
-- master; the client, on 127.0.0.1, reaches every process. Its watch is
-- moved to the second sentinel first (its subscription on the first
-- killed: it goes on to the next), which hears the switch, while the
-- first stays the one the client asks first. In plain Lua, and under
-- OpenResty in a real nginx (one worker) in front of the same group.
local helpers = require("spec.helpers")
local http = require("spec.support.http")
local redislock = require("redislock")

local COMMAND = helpers.sh_quote(helpers.spec_dir .. "../bin/redislock")

describe("Sentinel, a sentinel that lags behind a switch the watch heard", function()
  if not helpers.netns then
    return pending("a group cut in two: it needs the suite's own network namespace (make test as root)")
  end

  local g

  lazy_setup(function() g = helpers.start_sentinels({ own_addresses = true }) end)
  lazy_teardown(function()
    if g then
      g:heal()
      g:stop()
    end
  end)

  -- Whether a client is subscribed on sentinel s (sentinels subscribe on
  -- the nodes only: it is the client's watch).
  local function subscribed(s)
    return s:cli("CLIENT", "LIST"):find(" sub=1 ", 1, true) ~= nil
  end

  -- With the client's watch subscribed on the first sentinel: moves it to
  -- the second, cuts the master and the first sentinel off the rest, fails
  -- over there, and waits until heard(new) says the client's watch heard
  -- the switch. Returns the old master and the new one; the cut is undone
  -- when the test ends.
  local function lag_behind(heard)
    assert.is_true(g:caught_up(), "the replica never caught up")
    local s1, s2, s3 = g.sentinels[1], g.sentinels[2], g.sentinels[3]
    assert.is_truthy(helpers.eventually(10, function() return subscribed(s1) end), "the watch is not on sentinel 1")
    assert.is_true(tonumber(s1:cli("CLIENT", "KILL", "TYPE", "pubsub")) >= 1)
    assert.is_truthy(helpers.eventually(10, function() return subscribed(s2) end), "the watch stayed off sentinel 2")
    local old = g:master()
    local new = old == g.nodes[1] and g.nodes[2] or g.nodes[1]
    finally(function() g:heal() end)
    g:split({ old, s1 })
    -- At once (the second and third sentinel would fail over by themselves
    -- too, a second after they lost the master: either ends the same).
    s2:cli("SENTINEL", "FAILOVER", g.name)
    assert.is_truthy(helpers.eventually(30, function()
      return g:named_by(s2) == new.port and g:named_by(s3) == new.port and new:cli("ROLE"):match("^master\n")
    end), "the sentinels on the replica's side never promoted it")
    assert.is_truthy(helpers.eventually(10, function() return heard(new) end), "the client's watch never heard it")
    -- What today's resolution would find: the first sentinel names the old
    -- master, which says it is the master.
    assert.are.equal(old.port, (g:named_by(s1)))
    assert.matches("^master\n", old:cli("ROLE"))
    return old, new
  end

  -- Checks that a client of another process that asks the sentinels that
  -- know (the `redislock` command, exit 3 when the lock is held elsewhere)
  -- finds the lock on key held, and that it is on new (token), not on old.
  local function on_new(key, token, old, new)
    local out, _, code = helpers.run(helpers.lua .. " " .. COMMAND .. " run -E 3 --sentinels " .. g.addrs[2] .. ","
                                     .. g.addrs[3] .. " --master " .. g.name .. " " .. key .. " env -u LD_PRELOAD true")
    assert.are.equal(3, code, "the lock was free where the sentinels that know look: " .. out)
    assert.are.equal(token, new:cli("GET", "lock:{" .. key .. "}"))
    assert.are.equal("0", old:cli("EXISTS", "lock:{" .. key .. "}"))
  end

  it("takes the lock on the master the switch announced, not on the one a lagging sentinel names", function()
    local c = redislock.new({ sentinels = g.addrs, master = g.name })
    finally(function() c:close() end)
    assert(assert(c:acquire("lag:warm", 5)):release()) -- resolved through sentinel 1; the watch subscribes there
    -- The watch's count of a new client: 1 when subscribed on sentinel 1,
    -- 2 once that subscription is killed, 3 when subscribed on sentinel 2,
    -- 4 when the switch is heard.
    local old, new = lag_behind(function() return c._transport._watch:count() >= 4 end)
    local lock, err = c:acquire("lag:1", 10)
    assert.is_truthy(lock, err)
    on_new("lag:1", lock.token, old, new)
    assert.is_true(lock:release())
  end)

  -- The same through a worker's client: its watch (a timer) points the
  -- client at the new master on the switch (/pointed says so, without
  -- resolving); the next acquire resolves.
  describe("under OpenResty", function()
    if helpers.no_nginx(pending) then return end

    local nginx

    lazy_setup(function()
      nginx = helpers.start_nginx({
        workers = 1,
        http = { "lua_socket_log_errors off;" },
        server = {
          'set $redis_sentinels "' .. table.concat(g.addrs, ",") .. '";',
          'set $redis_master "' .. g.name .. '";',
          helpers.location("/acquire", "acquire"),
          helpers.location("/pointed", "pointed"),
        },
      })
    end)
    lazy_teardown(function() if nginx then nginx:stop() end end)

    it("takes the lock on the master the switch announced, not on the one a lagging sentinel names", function()
      local status, body = http.request(nginx.port, "GET", "/acquire?key=o:lag:warm&ttl=1")
      assert.are.equal(200, status, body .. nginx:error_log())
      local old, new = lag_behind(function(new)
        local st, port = http.request(nginx.port, "GET", "/pointed")
        return st == 200 and tonumber(port) == new.port
      end)
      status, body = http.request(nginx.port, "GET", "/acquire?key=o:lag&ttl=10")
      assert.are.equal(200, status, body .. nginx:error_log())
      on_new("o:lag", body:match("^%d+ (%S+)"), old, new)
    end)
  end)
end)
