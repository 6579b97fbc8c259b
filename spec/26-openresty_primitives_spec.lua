-- SPDX-License-Identifier: MIT
-- The semaphore, the read-write lock and the multi-key lock under OpenResty:
-- a real nginx with 2 workers, 200 requests in flight at once, over
-- cosockets; holds renewed by the worker's timer. The handlers are
-- spec/support/ngx_app.lua's. LuaJIT pass only (nginx loads that build).
local helpers = require "spec.helpers"
local http = require "spec.support.http"

describe("OpenResty: semaphore, read-write lock, multi-key lock", function()
  if not jit then
    pending("runs in the LuaJIT pass of make test (nginx loads the LuaJIT build)")
    return
  end

  local srv, raw, nginx

  lazy_setup(function()
    srv = helpers.start_redis()
    raw = srv:raw()
    nginx = helpers.start_nginx({
      workers = 2,
      http = table.concat({
        "lua_socket_log_errors off;",
        "server {",
        "  listen 127.0.0.1:{{port}};",
        '  set $redis_url "redis://127.0.0.1:' .. srv.port .. '";',
        '  location = /primitive { content_by_lua_block { require("spec.support.ngx_app").primitive() } }',
        "}",
      }, "\n"),
    })
  end)
  lazy_teardown(function()
    if raw then raw:close() end
    if nginx then nginx:stop() end
    if srv then srv:stop() end
  end)
  before_each(function()
    assert.are.equal("OK", raw:command("FLUSHALL"))
    raw:command("MSET", "readers", 0, "writers", 0, "overlaps", 0)
  end)

  -- Sends every path at once; checks every answer is 200 and both workers served.
  local function all_ok(paths)
    local results = http.parallel(nginx.port, paths, { timeout = 60 })
    for i, r in ipairs(results) do
      assert.are.equal(200, r.status, "request " .. i .. ": " .. r.body .. nginx:error_log())
    end
    return results
  end

  it("lets at most 3 of 200 concurrent requests hold a permit, and reaches 3", function()
    local paths = {}
    for i = 1, 200 do paths[i] = "/primitive?kind=sem&limit=3" end
    all_ok(paths)
    local seen = raw:command("LRANGE", "seen", 0, -1)
    assert.are.equal(200, #seen)
    local most = 0
    for _, n in ipairs(seen) do most = math.max(most, tonumber(n)) end
    assert.are.equal(3, most)
    assert.are.equal(0, raw:command("EXISTS", "lock:{pool}:permits"))
  end)

  it("lets readers overlap and writers overlap nothing under 200 concurrent requests", function()
    local paths = {}
    for i = 1, 200 do paths[i] = "/primitive?kind=" .. (i % 5 == 0 and "write" or "read") .. "&hold=0.005" end
    all_ok(paths)
    assert.are.equal("0", raw:command("GET", "overlaps"))
    assert.are.equal(0, raw:command("EXISTS", "lock:{doc}:rw:readers", "lock:{doc}:rw:writer"))
  end)

  it("takes multi-key locks in opposite orders beside single locks: no deadlock, no overlap", function()
    local paths = {}
    for i = 1, 150 do
      paths[i] = "/primitive?kind=multi&keys=" .. ({ "a,b,c", "c,b,a", "b", "c,a" })[i % 4 + 1]
    end
    all_ok(paths)
    assert.are.equal("0", raw:command("GET", "overlaps"))
    assert.are.equal(0, raw:command("EXISTS", "lock:{a}", "lock:{b}", "lock:{c}"))
  end)

  it("renews permits and holds with the worker's timer", function()
    all_ok({ "/primitive?kind=sem&limit=1&ttl=0.3&hold=1", "/primitive?kind=read&ttl=0.3&hold=1",
             "/primitive?kind=multi&keys=x,y&ttl=0.3&hold=1" })
    all_ok({ "/primitive?kind=write&ttl=0.3&hold=1" })
  end)
end)
