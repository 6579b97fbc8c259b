-- SPDX-License-Identifier: MIT
-- TLS on the OpenResty transport, in a real nginx: cosockets with
-- sslhandshake (SNI, the chain checked against lua_ssl_trusted_certificate,
-- the name checked by nginx), the client certificate through ngx.ssl, and
-- pools that never hand a connection to a client with other TLS settings.
-- The handlers are spec/support/ngx_app.lua's; the server is a real
-- redis-server with mutual TLS. LuaJIT pass only (nginx loads that build).
local helpers = require "spec.helpers"
local http = require "spec.support.http"

describe("OpenResty over TLS", function()
  if not jit then
    pending("runs in the LuaJIT pass of make test (nginx loads the LuaJIT build)")
    return
  end

  local srv, raw, nginx, certs

  -- A location running ngx_app handler `name` with TLS mode `mode` (see
  -- ngx_app's tls_option) and, if given, a server_name.
  local function location(path, name, mode, server_name, extra)
    if server_name == "" then server_name = " " end -- none (ngx_app ignores a blank)
    return string.format('location = %s { set $redis_tls "%s"; set $redis_tls_name "%s"; %s'
      .. ' content_by_lua_block { require("spec.support.ngx_app").%s() } }', path, mode, server_name or "localhost",
      extra or "", name)
  end

  lazy_setup(function()
    certs = helpers.tls_certs()
    srv = helpers.start_redis(nil, { tls = "yes" })
    raw = srv:raw()
    -- nginx resolves no names without a `resolver`: the address, and the
    -- name to check as server_name.
    local url = "rediss://127.0.0.1:" .. srv.port
    nginx = helpers.start_nginx({
      workers = 2,
      http = table.concat({
        "lua_socket_log_errors off;",
        "lua_ssl_trusted_certificate " .. certs .. "/ca.crt;",
        "lua_ssl_verify_depth 2;",
        "server {",
        "  listen 127.0.0.1:{{port}};",
        '  set $redis_url "' .. url .. '";',
        '  set $redis_timeout "";',
        '  set $redis_tls_dir "' .. certs .. '";',
        location("/counter", "counter", "mtls"),
        location("/acquire", "acquire", "mtls"),
        location("/nocert/acquire", "acquire", "nocert"),
        location("/wrongname/acquire", "acquire", "mtls", "redis.example"),
        location("/noverify/acquire", "acquire", "noverify", "redis.example"),
        -- Another db: another pool, so no connection verified elsewhere is reused.
        location("/untrusted/acquire", "acquire", "mtls", nil, "lua_ssl_trusted_certificate " .. certs
                 .. '/other.crt; set $redis_url "' .. url .. '/1";'),
        location("/ca/new", "new", "ca"),
        location("/ip/new", "new", "mtls", ""),
        location("/plain/acquire", "acquire", "", nil, 'set $redis_url "redis://127.0.0.1:' .. srv.port .. '";'),
        "}",
      }, "\n"),
    })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
    if raw then raw:close() end
    if srv then srv:stop() end
  end)
  before_each(function()
    assert.are.equal("OK", raw:command("FLUSHALL"))
  end)

  local function get(path)
    return http.request(nginx.port, "GET", path)
  end

  it("keeps 200 concurrent read-modify-writes exact under with_lock over mutual TLS", function()
    local reqs = {}
    for i = 1, 200 do reqs[i] = "/counter?lock=notify" end
    for i, res in ipairs(http.parallel(nginx.port, reqs, { timeout = 120 * helpers.slow })) do
      assert.are.equal(200, res.status, "request " .. i .. ": " .. res.body .. nginx:error_log())
    end
    assert.are.equal("200", raw:command("GET", "counter"))
    assert.are.equal(false, raw:command("GET", "overlaps"))
  end)

  it("takes a lock over mutual TLS, verified by name, that the server holds", function()
    local status, body = get("/acquire?key=tls&ttl=5")
    assert.are.equal(200, status, body)
    local token = body:match("^%d+ (%S+)")
    assert.are.equal(token, raw:command("GET", "lock:{tls}"))
  end)

  it("checks the name nginx verifies against (server_name), and reports a mismatch", function()
    local status, body = get("/wrongname/acquire?key=n")
    assert.are.equal(503, status, body)
    -- nginx names the cause unless the handshake finished at once (see ngx_conn.lua).
    assert.is_truthy(body:match("^connection: cannot connect to 127%.0%.0%.1:%d+ %(TLS: name mismatch")
                     or body:match('^connection: cannot connect to 127%.0%.0%.1:%d+ %(TLS: the server\'s certificate'
                                   .. ' failed verification, untrusted or not naming redis%.example;'), body)
    assert.are.equal(0, raw:command("EXISTS", "lock:{n}", "lock:{n}:fence"))
  end)

  it("reports a chain it does not trust (lua_ssl_trusted_certificate)", function()
    local status, body = get("/untrusted/acquire?key=u")
    assert.are.equal(503, status, body)
    assert.is_truthy(body:match("^connection: cannot connect to 127%.0%.0%.1:%d+ %(TLS: the server's certificate is"
      .. " not trusted") or body:match("^connection: cannot connect to 127%.0%.0%.1:%d+ %(TLS: the server's"
      .. " certificate failed verification"), body)
    assert.are.equal(0, raw:command("EVAL", "redis.call('SELECT', 1) return redis.call('EXISTS', KEYS[1])", 1,
                                    "lock:{u}"))
  end)

  it("reports a missing client certificate on a mutual-TLS server", function()
    local status, body = get("/nocert/acquire?key=c")
    assert.are.equal(503, status, body)
    assert.is_truthy(body:match("^connection: "), body)
    assert.are.equal(0, raw:command("EXISTS", "lock:{c}"))
  end)

  it("reports a plaintext client on the TLS port", function()
    local status, body = get("/plain/acquire?key=p")
    assert.are.equal(503, status, body)
    assert.is_truthy(body:match("^connection: "), body)
  end)

  it("never hands a pooled unverified connection to a verifying client", function()
    -- Each worker pools a connection made with verify = false for the wrong
    -- name; the verifying client for the same server and name must not get it.
    for _ = 1, 4 do
      local status, body = get("/noverify/acquire?key=v" .. _)
      assert.are.equal(200, status, body)
    end
    for _ = 1, 4 do
      local status, body = get("/wrongname/acquire?key=w")
      assert.are.equal(503, status, body)
    end
  end)

  it("refuses tls.ca at new(), which nginx cannot honour per connection", function()
    local status, body = get("/ca/new")
    assert.are.equal(500, status, body)
    assert.is_truthy(body:find("option 'tls.ca' cannot be honoured per connection under OpenResty", 1, true), body)
  end)

  it("refuses a verified address without server_name at new() (nginx checks DNS names only)", function()
    local status, body = get("/ip/new")
    assert.are.equal(500, status, body)
    assert.is_truthy(body:find("needs 'tls.server_name'", 1, true), body)
  end)
end)
