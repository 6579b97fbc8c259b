-- SPDX-License-Identifier: MIT
-- TLS to Redis on the blocking transport (sockets of its own, OpenSSL): a real
-- redis-server with TLS built in (Debian's), certificates made by openssl at
-- test time (spec/helpers.lua tls_certs). The lock API over mutual TLS, with
-- waiters, workers and the watchdog on TLS connections of their own; then
-- every way a connection must be refused, each a `connection` error naming
-- the cause, in bounded time, with nothing run on the server. Then the
-- OpenResty transport's TLS, in a real nginx, against the same servers.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")
local redislock = require("redislock")

-- Runs fn and returns its results and the seconds it took.
local function timed(fn)
  local t0 = core.now()
  local a, b = fn()
  return a, b, core.now() - t0
end

describe("TLS", function()
  local mtls, optional, plain, raw, certs

  lazy_setup(function()
    certs = helpers.tls_certs()
    mtls = helpers.start_redis(nil, { tls = "yes" })
    optional = helpers.start_redis(nil, { tls = "optional" })
    plain = helpers.start_redis()
    raw = mtls:raw() -- over the plaintext unix socket: it sees what TLS clients did
  end)
  lazy_teardown(function()
    if raw then raw:close() end
    for _, s in ipairs({ mtls, optional, plain }) do if s then s:stop() end end
  end)
  before_each(function()
    assert.are.equal("OK", raw:command("FLUSHALL"))
  end)

  local function file(name) return certs .. "/" .. name end

  -- TLS connections the server accepted so far (INFO stats).
  local function connections(srv)
    local r = srv:raw()
    local n = tonumber(r:command("INFO", "stats"):match("total_connections_received:(%d+)"))
    r:close()
    return n
  end

  describe("over mutual TLS", function()
    local client
    before_each(function() client = mtls:client() end)
    after_each(function() client:close() end)

    it("acquires, extends, reads, releases, and fences", function()
      local a = assert(client:acquire("orders:42", 5))
      assert.are.equal(a.token, raw:command("GET", "lock:{orders:42}"))
      assert.is_true(assert(a:extend(10)))
      assert.is_near(10, assert(a:ttl()), 0.5)
      assert.is_true(assert(a:release()))
      assert.are.equal(false, raw:command("GET", "lock:{orders:42}"))
      local b = assert(client:acquire("orders:42", 5))
      assert.is_true(b.fence > a.fence)
      local c, err = client:acquire("orders:42", 5)
      assert.is_nil(c)
      assert.is_truthy(err:match("^busy:"), err)
      assert.is_true(b:release())
    end)

    it("costs a release nothing when the server closed the connection while idle, and runs it once", function()
      -- No poll before a command: the server's end never acknowledged the
      -- release's bytes (it had closed the connection), so nothing ran, and
      -- the call goes again on a fresh connection.
      local lock = assert(client:acquire("tls:kill", 5))
      local id = assert(client._transport:command("CLIENT", "ID"))
      assert.are.equal(1, raw:command("CLIENT", "KILL", "ID", id))
      assert.is_true(assert(lock:release()))
      assert.are.equal(0, raw:command("EXISTS", "lock:{tls:kill}"))
      assert.are_not.equal(id, client._transport:command("CLIENT", "ID"))
      assert.are.equal(1, client:command("INCR", "tls:counter"))
      assert.are.equal(1, raw:command("CLIENT", "KILL", "ID", client._transport:command("CLIENT", "ID")))
      assert.are.equal(2, client:command("INCR", "tls:counter"))
    end)

    it("keeps one connection for many locks (the handshake is paid once)", function()
      assert(assert(client:acquire("warm", 1)):release())
      local before = connections(mtls)
      for i = 1, 200 do assert(assert(client:acquire("k" .. i % 7, 1)):release()) end
      assert.are.equal(before + 1, connections(mtls)) -- the +1 is the INFO client itself
    end)

    it("runs with_lock, returning fn's values, releasing when fn raises", function()
      local x, y = client:with_lock("job", 5, function(lock)
        assert.are.equal(lock.token, raw:command("GET", "lock:{job}"))
        return 1, "two"
      end)
      assert.are.same({ 1, "two" }, { x, y })
      assert.are.equal(false, raw:command("GET", "lock:{job}"))
      local ok, err = pcall(client.with_lock, client, "job", 5, function() error({ code = 7 }) end)
      assert.is_false(ok)
      assert.are.same({ code = 7 }, err)
      assert.are.equal(false, raw:command("GET", "lock:{job}"))
    end)

    it("renews over TLS past the TTL (the watchdog's own TLS connection)", function()
      local fence = client:with_lock("long", 0.3, function(lock)
        core.sleep(1.0)
        assert.are.equal(lock.token, raw:command("GET", "lock:{long}"))
        return lock.fence
      end)
      assert.is_number(fence)
      assert.are.equal(false, raw:command("GET", "lock:{long}"))
    end)

    it("wakes a waiter in another process on release (its waiter connection is TLS too)", function()
      local lock = assert(client:acquire("w", 30))
      local p = helpers.spawn(helpers.spec_dir .. "workers/waiter.lua", mtls.where, "w", 20, "notify", "plain", 0, "t1")
      assert.is_truthy(helpers.eventually(5, function()
        return tonumber(raw:command("INFO", "clients"):match("blocked_clients:(%d+)")) == 1
      end), "the waiter never blocked")
      assert.is_true(lock:release())
      local out, ok = p.wait()
      assert.is_true(ok, out)
      assert.is_truthy(out:match("^got t1 %d+"), out)
    end)

    it("excludes several processes from one another (a counter shows any overlap)", function()
      assert.are.equal("OK", raw:command("SET", "counter", 0))
      local procs, start_at = {}, core.now() + 0.5
      for i = 1, 3 do
        procs[i] = helpers.spawn(helpers.spec_dir .. "workers/counter.lua", mtls.where, "notify", 40, start_at)
      end
      for i = 1, 3 do
        local out, ok = procs[i].wait()
        assert.is_true(ok, out)
        assert.are.equal("overlaps 0", out:match("overlaps %d+"))
      end
      assert.are.equal("120", raw:command("GET", "counter"))
    end)

    it("authenticates an ACL user and selects its db over TLS", function()
      assert.are.equal("OK", raw:command("ACL", "SETUSER", "locker", "on", ">s3cret", "~*", "+@all"))
      local c = redislock.new(helpers.tls_opts(mtls.port, { url = "rediss://locker:s3cret@localhost:"
        .. mtls.port .. "/3" }))
      local l = assert(c:acquire("acl", 5))
      assert.are.equal(l.token, raw:command("EVAL", "redis.call('SELECT', 3) return redis.call('GET', KEYS[1])",
                                            1, "lock:{acl}"))
      assert.is_true(l:release())
      c:close()
      local bad = redislock.new(helpers.tls_opts(mtls.port, { username = "locker", password = "wrong" }))
      local _, err = bad:acquire("acl", 5)
      assert.is_truthy(err:match("^redis: AUTH refused by localhost:%d+: WRONGPASS"), err)
      bad:close()
      assert.are.equal(1, raw:command("ACL", "DELUSER", "locker"))
    end)

    it("checks an address against the certificate's IP SANs", function()
      local c = redislock.new(helpers.tls_opts(mtls.port, { host = "127.0.0.1" }))
      assert(assert(c:acquire("ip", 1)):release())
      c:close()
    end)
  end)

  describe("rediss:// URLs", function()
    it("turn TLS on, with the tls table adding details", function()
      local c = redislock.new({ url = "rediss://localhost:" .. optional.port, tls = { ca = file("ca.crt") } })
      assert(assert(c:acquire("u", 1)):release())
      c:close()
    end)

    it("verify against the system store by default, which does not trust a private CA", function()
      local c = redislock.new("rediss://localhost:" .. optional.port)
      local l, err, took = timed(function() return c:acquire("u", 1) end)
      assert.is_nil(l)
      assert.is_truthy(err:match("^connection: cannot connect to localhost:%d+ %(TLS: the server's certificate is not"
        .. " trusted: "), err)
      assert.is_true(took < 1)
      c:close()
    end)
  end)

  describe("refuses", function()
    -- Tries one acquire with opts against srv; returns the error and the seconds it took.
    local function refused(opts, bound)
      local c = redislock.new(opts)
      local l, err, took = timed(function() return c:acquire("never", 5) end)
      c:close()
      assert.is_nil(l)
      assert.is_true(took < (bound or 1.5), "took " .. took .. " s")
      -- Nothing ran: no lock, and no holder's fence.
      for _, s in ipairs({ raw, optional:raw() }) do
        assert.are.equal(0, s:command("EXISTS", "lock:{never}", "lock:{never}:fence"))
      end
      return err
    end

    it("a certificate from another CA", function()
      local err = refused(helpers.tls_opts(optional.port, { tls = { ca = file("other.crt") } }))
      assert.is_truthy(err:match("^connection: cannot connect to localhost:%d+ %(TLS: the server's certificate is"
        .. " not trusted: .*tls%.ca names the trust anchors%)$"), err)
    end)

    it("a certificate that does not name the server", function()
      local err = refused(helpers.tls_opts(optional.port,
                                           { tls = { ca = file("ca.crt"), server_name = "redis.example" } }))
      assert.is_truthy(err:find('name mismatch: the server\'s certificate does not name "redis.example"', 1, true), err)
      assert.is_truthy(err:match("^connection: cannot connect to"), err)
    end)

    it("an address that is not in the certificate", function()
      local err = refused({ host = "127.0.0.1", port = optional.port,
                            tls = { ca = file("ca.crt"), server_name = "127.0.0.2" } })
      assert.is_truthy(err:find('name mismatch: the server\'s certificate does not name "127.0.0.2"', 1, true), err)
      err = refused({ host = "127.0.0.1", port = optional.port, tls = { ca = file("ca.crt"), server_name = "::1" } })
      assert.is_truthy(err:find('does not name "::1"', 1, true), err)
    end)

    it("a client without a certificate on a mutual-TLS server", function()
      local err = refused({ host = "localhost", port = mtls.port, tls = { ca = file("ca.crt") } })
      assert.is_truthy(err:match("^connection: cannot connect to localhost:%d+ %(TLS: "), err)
      assert.is_truthy(err:find("client certificate", 1, true), err)
    end)

    it("a client certificate from a CA the server does not trust", function()
      local err = refused({ host = "localhost", port = mtls.port,
                            tls = { ca = file("ca.crt"), cert = file("other.crt"), key = file("other.key") } })
      assert.is_truthy(err:match("^connection: cannot connect to localhost:%d+ %(TLS: "), err)
    end)

    it("a plaintext client on a TLS port", function()
      local err = refused({ port = optional.port })
      assert.is_truthy(err:match("^connection: 127%.0%.0%.1:%d+ closed the connection before any answer %(a TLS"
        .. " port%? use rediss:// or tls = true%)$"), err)
    end)

    it("a TLS client on a plaintext port, within connect_timeout", function()
      local err = refused({ port = plain.port, connect_timeout = 0.3, tls = { ca = file("ca.crt") } }, 1)
      assert.is_truthy(err:match("^connection: cannot connect to 127%.0%.0%.1:%d+ %(TLS: .*not a TLS port"), err)
      assert.are.equal(0, plain:raw():command("EXISTS", "lock:{never}"))
    end)

    it("but connects unchecked with verify = false (a certificate from another CA)", function()
      local c = redislock.new(helpers.tls_opts(optional.port, { tls = { ca = file("other.crt"), verify = false } }))
      local l = assert(c:acquire("unchecked", 1))
      assert.is_true(l:release())
      c:close()
    end)
  end)

  describe("settings", function()
    local function new_error(opts)
      local ok, err = pcall(redislock.new, opts)
      assert.is_false(ok)
      return err
    end

    it("are checked at new(): files, the key against the certificate, fields", function()
      local base = { host = "localhost", port = optional.port }
      local function with(tls)
        local o = {}
        for k, v in pairs(base) do o[k] = v end
        o.tls = tls
        return new_error(o)
      end
      assert.are.equal("bad argument #1 to 'new' (tls.ca: cannot read \"" .. file("none.crt")
        .. "\": No such file or directory)", with({ ca = file("none.crt") }))
      assert.is_truthy(with({ ca = file("server.ext") }):find("tls.ca: \"" .. file("server.ext")
        .. "\" holds no PEM certificate", 1, true))
      assert.are.equal("bad argument #1 to 'new' (tls.key \"" .. file("stray.key") .. "\" does not match tls.cert \""
        .. file("client.crt") .. "\")", with({ cert = file("client.crt"), key = file("stray.key") }))
      assert.is_truthy(with({ cert = file("client.crt") }):find("'tls.cert' and 'tls.key' go together", 1, true))
      assert.is_truthy(with({ cafile = "x" }):find("unknown field \"cafile\"", 1, true))
      assert.is_truthy(with({ verify = "yes" }):find("field 'tls.verify' must be a boolean", 1, true))
      assert.is_truthy(with(1):find("option 'tls' must be a boolean or a table", 1, true))
      assert.is_truthy(new_error({ path = "redis.sock", tls = true }):find("needs a TCP host", 1, true))
      assert.is_truthy(new_error({ url = "rediss://localhost:1", tls = false }):find("contradicts", 1, true))
      -- The file errors come from the C core too, for direct callers.
      local ok, err = pcall(core.new, { port = 1, tls = { ca = file("none.crt") } })
      assert.is_false(ok)
      assert.is_truthy(err:find("tls.ca: cannot read", 1, true), err)
    end)

    it("are shown by the client", function()
      local c = redislock.new(helpers.tls_opts(optional.port))
      assert.are.equal("redislock.Client (localhost:" .. optional.port .. ", TLS)", tostring(c))
      c:close()
    end)
  end)

  -- TLS on the OpenResty transport, in a real nginx: cosockets with
  -- sslhandshake (SNI, the chain checked against lua_ssl_trusted_certificate,
  -- the name checked by nginx), the client certificate through ngx.ssl, and
  -- pools that never hand a connection to a client with other TLS settings.
  -- The handlers are spec/support/ngx_app.lua's; the server is a real
  -- redis-server with mutual TLS. LuaJIT pass only (nginx loads that build).
  describe("under OpenResty", function()
    if helpers.no_nginx(pending) then return end

    local srv, nginx

    -- A location running ngx_app handler `name` with TLS mode `mode` (see
    -- ngx_app's tls_option) and, if given, a server_name.
    local function location(path, name, mode, server_name, extra)
      if server_name == "" then server_name = " " end -- none (ngx_app ignores a blank)
      return string.format('location = %s { set $redis_tls "%s"; set $redis_tls_name "%s"; %s'
        .. ' content_by_lua_block { require("spec.support.ngx_app").%s() } }', path, mode, server_name or "localhost",
        extra or "", name)
    end

    lazy_setup(function()
      srv = mtls
      -- nginx resolves no names without a `resolver`: the address, and the
      -- name to check as server_name.
      local url = "rediss://127.0.0.1:" .. srv.port
      nginx = helpers.start_nginx({
        workers = 2,
        http = { "lua_socket_log_errors off;", "lua_ssl_trusted_certificate " .. certs .. "/ca.crt;",
                 "lua_ssl_verify_depth 2;" },
        server = {
          'set $redis_url "' .. url .. '";',
          'set $redis_timeout "";',
          'set $redis_tls_dir "' .. certs .. '";',
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
        },
      })
    end)
    lazy_teardown(function()
      if nginx then nginx:stop() end
    end)
    before_each(function()
      assert.are.equal("OK", raw:command("FLUSHALL"))
    end)

    local function get(path)
      return http.request(nginx.port, "GET", path)
    end

    it("keeps 200 concurrent read-modify-writes exact under with_lock over mutual TLS", function()
      nginx:counter(200, "notify", raw)
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
end)
