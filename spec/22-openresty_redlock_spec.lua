-- SPDX-License-Identifier: MIT
-- Redlock under OpenResty, in a real nginx (2 workers) in front of five
-- independent redis-servers (spec/helpers.lua): each call goes to every
-- server at once in light threads, and the worker's timer renews on a
-- majority. The handlers are spec/support/ngx_app.lua's. LuaJIT pass only
-- (nginx loads that build).
local helpers = require "spec.helpers"
local http = require "spec.support.http"

describe("OpenResty with Redlock", function()
  if not jit then
    pending("runs in the LuaJIT pass of make test (nginx loads the LuaJIT build)")
    return
  end

  local servers, urls, nginx, raw

  lazy_setup(function()
    servers, urls = helpers.start_redlock(5)
    raw = servers[1]:raw()
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
        '  set $redis_redlock "' .. urls .. '";',
        '  set $redis_data_url "' .. servers[1].url .. '";',
        location("/counter", "counter"),
        location("/acquire", "acquire"),
        location("/with_lock", "with_lock"),
        "}",
      }, "\n"),
    })
  end)
  lazy_teardown(function()
    if raw then raw:close() end
    if nginx then nginx:stop() end
    for _, s in ipairs(servers or {}) do
      os.execute("kill -CONT " .. s.pid .. " 2>/dev/null")
      s:stop()
    end
  end)

  local function get(path)
    return http.request(nginx.port, "GET", path)
  end

  it("takes the lock on all five servers", function()
    local status, body = get("/acquire?key=o:r1&ttl=5")
    assert.are.equal(200, status, body .. nginx:error_log())
    local token = body:match("^%d+ (%S+)")
    for _, s in ipairs(servers) do assert.are.equal(token, s:cli("GET", "lock:{o:r1}")) end
  end)

  it("keeps 100 concurrent read-modify-writes exact under with_lock", function()
    for _, k in ipairs({ "counter", "inside", "overlaps" }) do assert(raw:command("DEL", k)) end
    local reqs = {}
    for i = 1, 100 do reqs[i] = "/counter?lock=poll" end
    local workers = {}
    for i, res in ipairs(http.parallel(nginx.port, reqs, { timeout = 120 * helpers.slow })) do
      assert.are.equal(200, res.status, "request " .. i .. ": " .. res.body .. nginx:error_log())
      workers[res.headers["x-worker"]] = true
    end
    assert.are.equal("100", raw:command("GET", "counter"))
    assert.is_false(raw:command("GET", "overlaps"))
    local n = 0
    for _ in pairs(workers) do n = n + 1 end
    assert.are.equal(2, n)
  end)

  it("takes and renews locks with 2 of 5 servers stopped", function()
    for i = 4, 5 do os.execute("kill -STOP " .. servers[i].pid) end
    local ok, err = pcall(function()
      local status, body = get("/acquire?key=o:r2&ttl=5")
      assert.are.equal(200, status, body .. nginx:error_log())
      status, body = get("/with_lock?key=o:r3&ttl=0.6&hold=1.5")
      assert.are.equal(200, status, body .. nginx:error_log())
    end)
    for i = 4, 5 do os.execute("kill -CONT " .. servers[i].pid) end
    assert(ok, err)
  end)

  it("fails with 3 of 5 stopped, saying how many it reached", function()
    for i = 3, 5 do os.execute("kill -STOP " .. servers[i].pid) end
    local status, body = get("/acquire?key=o:r4&ttl=5")
    for i = 3, 5 do os.execute("kill -CONT " .. servers[i].pid) end
    assert.are.equal(503, status)
    assert.matches("^connection: reached 2 of 5 Redlock servers", body)
  end)
end)
