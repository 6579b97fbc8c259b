-- SPDX-License-Identifier: MIT
-- Sentinel under OpenResty, in a real nginx (2 workers) in front of a real
-- Sentinel group (spec/helpers.lua): each worker's client resolves the
-- master over cosockets, its watch (a timer, redislock/ngx_watch.lua) hears
-- +switch-master and moves the client, and renewals follow. The handlers are
-- spec/support/ngx_app.lua's. LuaJIT pass only (nginx loads that build).
local core = require "redislock.core"
local helpers = require "spec.helpers"
local http = require "spec.support.http"

describe("OpenResty behind Sentinel", function()
  if not jit then
    pending("runs in the LuaJIT pass of make test (nginx loads the LuaJIT build)")
    return
  end

  local g, nginx

  lazy_setup(function()
    g = helpers.start_sentinels()
    local function location(path, name)
      return string.format("location = %s { content_by_lua_block { require('spec.support.ngx_app').%s() } }",
                           path, name)
    end
    nginx = helpers.start_nginx({
      workers = 2,
      http = table.concat({
        "lua_socket_log_errors off;",
        "server {",
        "  listen 127.0.0.1:{{port}};",
        '  set $redis_sentinels "' .. table.concat(g.addrs, ",") .. '";',
        '  set $redis_master "mymaster";',
        location("/acquire", "acquire"),
        location("/with_lock", "with_lock"),
        location("/master", "master"),
        location("/section", "section"),
        "}",
      }, "\n"),
    })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
    if g then g:stop() end
  end)

  local function get(path)
    return http.request(nginx.port, "GET", path)
  end

  -- Asks until both workers answered /master; returns their ports by pid.
  local function masters()
    local seen, n = {}, 0
    for _ = 1, 50 do
      local status, body = get("/master")
      assert.are.equal(200, status, body)
      local port, pid = body:match("^(%d+) (%d+)")
      if not seen[pid] then n = n + 1 end
      seen[pid] = tonumber(port)
      if n == 2 then break end
    end
    assert.are.equal(2, n, "only one worker answered")
    return seen
  end

  it("takes locks on the master the sentinels name, in every worker", function()
    local m = g:master()
    for _ = 1, 4 do
      local status, body = get("/acquire?key=o:" .. _ .. "&ttl=5")
      assert.are.equal(200, status, body .. nginx:error_log())
      local token = body:match("^%d+ (%x+)")
      assert.are.equal(token, m:cli("GET", "lock:{o:" .. _ .. "}"))
    end
    for _, port in pairs(masters()) do assert.are.equal(m.port, port) end
  end)

  it("keeps concurrent with_lock loops going across a failover: no overlaps, none on the demoted master", function()
    if helpers.slow > 1 then return pending("timing-bound: not under REDISLOCK_SLOW") end
    assert.is_true(g:caught_up(), "the replica never caught up")
    g:loops_across_failover(function(start_at)
      return helpers.spawn(helpers.spec_dir .. "workers/http_loop.lua", nginx.port, "/section?key=o:loop", 6,
                           start_at)
    end)
  end)

  it("follows a failover at once in every worker, and renews a held lock on the new master", function()
    local before = g:master()
    assert.is_true(g:caught_up(), "the replica never caught up")
    masters() -- both workers resolved (and watch) before the failover
    -- A lock held across the failover (ttl 3 s, held 8 s): renewed by the
    -- worker's timer, on the new master once the switch is heard.
    local hold = http.start(nginx.port, "GET", "/with_lock?key=o:held&ttl=3&hold=8", { timeout = 30 })
    assert.is_truthy(helpers.eventually(5, function() return before:cli("EXISTS", "lock:{o:held}") == "1" end))
    core.sleep(0.5) -- replicated
    local old, new = g:failover()
    assert.are.equal(before, old)
    -- Every worker moved as soon as the switch was announced, while the old
    -- master still takes writes: the next locks are on the new master.
    for pid, port in pairs(masters()) do assert.are.equal(new.port, port, "worker " .. pid) end
    for i = 1, 4 do
      local status, body = get("/acquire?key=o:after" .. i .. "&ttl=5")
      assert.are.equal(200, status, body .. nginx:error_log())
      assert.are.equal(body:match("^%d+ (%x+)"), new:cli("GET", "lock:{o:after" .. i .. "}"))
    end
    local status, body = hold:finish()
    assert.are.equal(200, status, body .. nginx:error_log())
  end)
end)
