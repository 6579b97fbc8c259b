-- SPDX-License-Identifier: MIT
-- Redis Cluster under OpenResty, in a real nginx (2 workers) in front of a
-- real cluster (3 masters, 3 replicas; spec/helpers.lua): each worker's
-- client routes over cosockets (a pool per node), follows redirects, and its
-- renewal timer follows a slot that moves. The handlers are
-- spec/support/ngx_app.lua's. LuaJIT pass only (nginx loads that build).
local core = require "redislock.core"
local helpers = require "spec.helpers"
local http = require "spec.support.http"
local redislock = require "redislock"

describe("OpenResty on Redis Cluster", function()
  if not jit then
    pending("runs in the LuaJIT pass of make test (nginx loads the LuaJIT build)")
    return
  end

  local cl, nginx, c

  lazy_setup(function()
    cl = helpers.start_cluster()
    c = redislock.new({ cluster = cl.seeds })
    local function location(path, name, more)
      return string.format("location = %s { %s content_by_lua_block { require('spec.support.ngx_app').%s() } }",
                           path, more or "", name)
    end
    nginx = helpers.start_nginx({
      workers = 2,
      http = table.concat({
        "lua_socket_log_errors off;",
        "server {",
        "  listen 127.0.0.1:{{port}};",
        '  set $redis_cluster "' .. table.concat(cl.seeds, ",") .. '";',
        location("/counter", "counter"),
        location("/acquire", "acquire"),
        location("/with_lock", "with_lock"),
        location("/section", "section"),
        location("/tls/new", "new", 'set $redis_tls "mtls"; set $redis_tls_dir "' .. helpers.tls_certs() .. '";'),
        "}",
      }, "\n"),
    })
  end)
  lazy_teardown(function()
    if c then c:close() end
    if nginx then nginx:stop() end
    if cl then cl:stop() end
  end)

  local function get(path)
    return http.request(nginx.port, "GET", path)
  end

  it("takes locks on every master, each at its slot's owner", function()
    local on = {}
    for i = 1, 30 do
      local key = "o:spread:" .. i
      local status, body = get("/acquire?key=" .. key .. "&ttl=5")
      assert.are.equal(200, status, body .. nginx:error_log())
      local owner = cl:owner(core.lock_slot(key))
      assert.are.equal(body:match("^%d+ (%S+)"), owner:cli("GET", "lock:{" .. key .. "}"))
      on[owner.port] = true
    end
    local n = 0
    for _ in pairs(on) do n = n + 1 end
    assert.are.equal(3, n)
  end)

  for _, mode in ipairs({ "notify", "fair" }) do
    it("keeps 200 concurrent read-modify-writes exact under with_lock (" .. mode .. ")", function()
      for _, k in ipairs({ "counter", "inside", "overlaps" }) do assert(c:command("DEL", k)) end
      local reqs = {}
      for i = 1, 200 do reqs[i] = "/counter?lock=" .. mode end
      local workers = {}
      for i, res in ipairs(http.parallel(nginx.port, reqs, { timeout = 120 * helpers.slow })) do
        assert.are.equal(200, res.status, "request " .. i .. ": " .. res.body .. nginx:error_log())
        workers[res.headers["x-worker"]] = true
      end
      assert.are.equal("200", c:command("GET", "counter"))
      assert.is_false(c:command("GET", "overlaps"))
      local n = 0
      for _ in pairs(workers) do n = n + 1 end
      assert.are.equal(2, n)
    end)
  end

  it("keeps with_lock loops going while their slot moves: no overlaps, fences growing", function()
    if helpers.slow > 1 then return pending("timing-bound: not under REDISLOCK_SLOW") end
    local key = "o:migrating"
    local slot = core.lock_slot(key)
    local to
    local sections = helpers.loops_across(function(start_at)
      return helpers.spawn(helpers.spec_dir .. "workers/http_loop.lua", nginx.port, "/section?key=" .. key, 6,
                           start_at)
    end, function()
      local from = cl:owner(slot)
      to = cl:other_master(from)
      cl:begin_move(slot, from, to)
      core.sleep(0.3)
      cl:move_keys(slot, from, to)
      core.sleep(0.3)
      cl:end_move(slot, from, to)
    end, true)
    local on_new = 0
    for _, s in ipairs(sections) do if s.port == to.port then on_new = on_new + 1 end end
    assert.is_true(on_new > 10, "sections on the new owner: " .. on_new)
  end)

  it("keeps with_lock loops going across a CLUSTER FAILOVER of their master", function()
    if helpers.slow > 1 then return pending("timing-bound: not under REDISLOCK_SLOW") end
    local key = "o:takeover"
    local slot = core.lock_slot(key)
    local new
    local sections = helpers.loops_across(function(start_at)
      return helpers.spawn(helpers.spec_dir .. "workers/http_loop.lua", nginx.port, "/section?key=" .. key, 6,
                           start_at)
    end, function()
      new = cl:replica_of(cl:owner(slot))
      assert.are.equal("OK", new:cli("CLUSTER", "FAILOVER"))
      assert.is_truthy(helpers.eventually(10, function() return cl:owner(slot, new) == new end))
    end, true)
    assert.is_true(cl:settled(20), "the cluster did not settle after the failover")
    local on_new = 0
    for _, s in ipairs(sections) do if s.port == new.port then on_new = on_new + 1 end end
    assert.is_true(on_new > 10, "sections on the new master: " .. on_new)
  end)

  it("refuses TLS without a server_name at new(): nginx checks DNS names, the cluster names addresses", function()
    local status, body = get("/tls/new")
    assert.are.equal(500, status)
    assert.matches("TLS to a cluster needs 'tls.server_name'", body, 1, true)
  end)

  it("renews a held lock across its slot's move (the worker's timer follows MOVED)", function()
    local key = "o:renewed"
    local slot = core.lock_slot(key)
    local hold = http.start(nginx.port, "GET", "/with_lock?key=" .. key .. "&ttl=0.6&hold=2", { timeout = 30 })
    assert.is_truthy(helpers.eventually(5, function()
      return cl:owner(slot):cli("EXISTS", "lock:{" .. key .. "}") == "1"
    end))
    local _, to = cl:move(slot)
    assert.is_truthy(helpers.eventually(1, function()
      return tonumber(to:cli("PTTL", "lock:{" .. key .. "}")) > 0
    end))
    local status, body = hold:finish()
    assert.are.equal(200, status, body .. nginx:error_log())
    assert.are.equal("0", to:cli("EXISTS", "lock:{" .. key .. "}"))
  end)
end)
