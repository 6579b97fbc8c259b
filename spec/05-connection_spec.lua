-- SPDX-License-Identifier: MIT
-- The blocking transport against real redis-servers: refused connections,
-- connections killed by the server, command timeouts, AUTH (password and ACL
-- user), SELECT, unix sockets, fork() and closed clients.
local helpers = require("spec.helpers")
local http = require("spec.support.http")
local redislock = require("redislock")
local core = require("redislock.core")

local now = core.now
local slow = helpers.slow

-- Starts `redis-cli DEBUG SLEEP seconds` in the background and returns once the
-- server is really asleep (a probe's PING times out), so the next command is
-- sure to hit a sleeping server. :wait() returns when the sleep is over.
local function sleep_server(srv, seconds)
  local p = assert(io.popen("redis-cli -p " .. srv.port .. " DEBUG SLEEP " .. seconds .. " 2>&1"))
  local probe = core.new({ port = srv.port, timeout_ms = 50 })
  local deadline = now() + 2 * slow
  local asleep = false
  while not asleep and now() < deadline do
    local ok, err = probe:command("PING")
    asleep = not ok and err:find("timeout", 1, true) ~= nil
  end
  probe:close()
  local handle = {
    wait = function()
      local out = p:read("*a")
      p:close()
      return out
    end,
  }
  if not asleep then
    handle.wait()
    error("the server never went to sleep (DEBUG SLEEP not running?)")
  end
  return handle
end

local function client_id(client)
  return assert(client._transport:command("CLIENT", "ID"))
end

local function client_info(client)
  return assert(client._transport:command("CLIENT", "INFO"))
end

------------------------------------------------------------------------------
-- fork(), _exit() and wait() for the fork spec: spec/support/fork.c, built by
-- `make` next to the module (luaposix's signatures: fork() -> pid, 0 in the
-- child; _exit(code); wait(pid) -> pid, "exited"|"killed", code).

local function process_functions()
  return require("spec_fork")
end

------------------------------------------------------------------------------

describe("a refused connection", function()
  it("returns a connection error at once, well within connect_timeout", function()
    local port = helpers.free_port()
    local connect_timeout = 3 * slow
    local client = redislock.new({ port = port, connect_timeout = connect_timeout })
    local t0 = now()
    local lock, err = client:acquire("k", 5)
    local elapsed = now() - t0
    assert.is_nil(lock)
    assert.matches("^connection:", err)
    assert.truthy(err:find(tostring(port), 1, true), err)
    assert.are.equal("connect", core.error_class(err)) -- nothing was sent
    -- Refused is an answer, not a silence: no waiting for the connect timeout.
    assert.is_true(elapsed < 0.5 * slow, "took " .. elapsed .. " s")
  end)

  it("makes with_lock raise the connection error without calling fn", function()
    local client = redislock.new({ port = helpers.free_port() })
    local called = false
    local ok, err = pcall(client.with_lock, client, "k", 5, function() called = true end)
    assert.is_false(ok)
    assert.equals("string", type(err))
    assert.matches("^connection:", err)
    assert.is_false(called)
  end)
end)

describe("a connection killed by the server", function()
  local srv
  lazy_setup(function() srv = helpers.start_redis() end)
  lazy_teardown(function() if srv then srv:stop() end end)

  local function kill(client)
    local id = client_id(client)
    assert.equals("1", srv:cli("CLIENT", "KILL", "ID", tostring(id)), "CLIENT KILL ID " .. id)
    return id
  end

  it("costs an acquire nothing: the dead connection is replaced before sending", function()
    local client = srv:client()
    local first = assert(client:acquire("kill:a", 5))
    assert.is_true(first:release())
    local old_id = kill(client)

    -- wait = 0, yet no error: the transport sees the closed socket before it
    -- sends, and connects afresh.
    local lock, err = client:acquire("kill:a", 5)
    assert.truthy(lock, err)
    assert.is_true(lock.fence > first.fence)
    assert.are_not.equal(old_id, client_id(client))
    assert.is_true(lock:release())
  end)

  it("is hidden by acquire's wait: the retry reconnects", function()
    local client = srv:client()
    assert(client:acquire("kill:b", 5)):release()
    kill(client)
    local lock, err = client:acquire("kill:b", 5, { wait = 1 })
    assert.truthy(lock, err)
    assert.is_true(lock:release())
  end)

  it("costs a plain command nothing, and runs it once", function()
    local client = srv:client()
    assert.equals(1, client:command("INCR", "kill:counter"))
    kill(client)
    assert.equals(2, client:command("INCR", "kill:counter"))
  end)

  it("costs a held lock nothing at release", function()
    local client = srv:client()
    local lock = assert(client:acquire("kill:c", 5))
    kill(client)
    assert.is_true(lock:release())
    assert.equals("0", srv:cli("EXISTS", "lock:{kill:c}"))
  end)

  it("does not break with_lock when the connection dies while fn runs", function()
    -- The case of a long job and a server (or proxy) that drops idle clients.
    local client = srv:client()
    local result = client:with_lock("kill:d", 30, function()
      kill(client)
      return "done"
    end)
    assert.equals("done", result)
    assert.equals("0", srv:cli("EXISTS", "lock:{kill:d}"))
  end)
end)

describe("a server slower than the command timeout", function()
  local srv
  lazy_setup(function() srv = helpers.start_redis() end)
  lazy_teardown(function() if srv then srv:stop() end end)

  local SLEEP = 0.6 * slow

  it("times out, leaves no lock without expiry, and the client recovers", function()
    local client = srv:client({ timeout = 0.2 })
    -- Connected, with the scripts cached: the timed-out EVALSHA below does run
    -- on the server once it wakes, which is the case worth checking.
    assert(client:acquire("warm", 1)):release()
    local bg = sleep_server(srv, SLEEP)
    local t0 = now()
    local lock, err = client:acquire("slow:a", 0.5)
    local elapsed = now() - t0
    bg:wait()
    assert.is_nil(lock)
    assert.matches("^connection:", err)
    assert.matches("timeout", err)
    assert.are.equal("timeout", core.error_class(err)) -- sent: it may have run
    assert.is_true(elapsed >= 0.18, "gave up after " .. elapsed .. " s, before the 0.2 s timeout")
    assert.is_true(elapsed < 0.45 * slow, "took " .. elapsed .. " s")

    -- The orphaned acquire may have landed, but only with its expiry: never -1.
    local pttl = tonumber(srv:cli("PTTL", "lock:{slow:a}"))
    assert.is_true(pttl == -2 or (pttl > 0 and pttl <= 500), "PTTL " .. tostring(pttl))

    -- Same client, new connection; waits out the orphan's 0.5 s at most.
    local again, err2 = client:acquire("slow:a", 5, { wait = 2 * slow })
    assert.truthy(again, err2)
    assert.is_true(again:release())
  end)

  it("a release retried after an unanswered one that landed says released, not lost", function()
    local client = srv:client({ timeout = 0.2 })
    local lock = assert(client:acquire("slow:r", 30)) -- outlives the sleep, even under valgrind
    local bg = sleep_server(srv, SLEEP)
    local ok, err = lock:release()
    bg:wait()
    assert.is_nil(ok)
    assert.matches("^connection:.*timeout", err)
    -- The server ran that release when it woke: the key is gone.
    assert.equals("0", srv:cli("EXISTS", "lock:{slow:r}"))
    assert.is_true(lock:release())
  end)

  it("a release retried after an unanswered one says lost when the lock expired first", function()
    local client = srv:client({ timeout = 0.2 })
    local lock = assert(client:acquire("slow:x", 0.3))
    -- The server sleeps past the lock's expiry, then runs the release on a key
    -- that is already gone: the lock was lost before it was released.
    local bg = sleep_server(srv, SLEEP)
    local ok, err = lock:release()
    bg:wait()
    assert.is_nil(ok)
    assert.matches("^connection:.*timeout", err)
    local again, err2 = lock:release()
    assert.is_nil(again)
    assert.matches('^lost: "slow:x" is no longer ours', err2)
  end)

  it("an acquire with wait issued during the sleep resends the same token and succeeds", function()
    local client = srv:client({ timeout = 0.2 })
    assert(client:acquire("warm", 1)):release()
    local bg = sleep_server(srv, SLEEP)
    -- Every send times out until the server wakes; it then runs the queued
    -- sends, the first of which takes the key. Only a resend-safe acquire
    -- (own token = success) gets it: the key outlives the wait.
    local ttl, wait = 5 * slow, 2 * slow
    local lock, err = client:acquire("slow:b", ttl, { wait = wait })
    bg:wait()
    assert.truthy(lock, err)
    assert.equals(lock.token, srv:cli("GET", "lock:{slow:b}"))
    assert.equals(tostring(lock.fence), srv:cli("GET", "lock:{slow:b}:fence"))
    local pttl = tonumber(srv:cli("PTTL", "lock:{slow:b}"))
    assert.is_true(pttl > 0 and pttl <= ttl * 1000, "PTTL " .. tostring(pttl))
    assert.is_true(lock:release())
  end)
end)

describe("authentication", function()
  local srv
  lazy_setup(function()
    srv = helpers.start_redis({ "--requirepass", "s3cret" })
    srv.password = "s3cret"
    assert.equals("OK", srv:cli("ACL", "SETUSER", "locker", "on", ">pw1", "~*", "+@all"))
  end)
  lazy_teardown(function() if srv then srv:stop() end end)

  local function works(client, user)
    local lock, err = client:acquire("auth", 5)
    assert.truthy(lock, err)
    assert.equals(user, client._transport:command("ACL", "WHOAMI"))
    assert.is_true(lock:release())
  end

  it("with the password works", function()
    works(srv:client({ password = "s3cret" }), "default")
  end)

  it("with the password in the URL works", function()
    works(redislock.new("redis://:s3cret@127.0.0.1:" .. srv.port), "default")
  end)

  it("with a wrong password is a redis error naming AUTH", function()
    local lock, err = srv:client({ password = "wrong" }):acquire("auth", 5)
    assert.is_nil(lock)
    assert.matches("^redis:", err)
    assert.truthy(err:find("AUTH", 1, true), err)
    assert.are.equal("redis", core.error_class(err))
  end)

  it("without a password is a redis error (NOAUTH)", function()
    local lock, err = srv:client():acquire("auth", 5)
    assert.is_nil(lock)
    assert.matches("^redis:", err)
    assert.truthy(err:find("NOAUTH", 1, true), err)
  end)

  it("as an ACL user works", function()
    works(srv:client({ username = "locker", password = "pw1" }), "locker")
  end)

  it("as an ACL user in the URL works", function()
    works(redislock.new("redis://locker:pw1@127.0.0.1:" .. srv.port), "locker")
  end)

  it("as an ACL user with a wrong password is a redis error", function()
    local lock, err = srv:client({ username = "locker", password = "s3cret" }):acquire("auth", 5)
    assert.is_nil(lock)
    assert.matches("^redis:", err)
    assert.truthy(err:find("AUTH", 1, true), err)
  end)
end)

describe("database selection", function()
  local srv
  lazy_setup(function() srv = helpers.start_redis() end)
  lazy_teardown(function() if srv then srv:stop() end end)

  local function exists(db, key)
    return srv:cli("-n", tostring(db), "EXISTS", key) == "1"
  end

  it("db = 3 keeps the lock and its slot's fence record in db 3", function()
    local record = "lock:{" .. core.era_tag(core.lock_slot("db:a")) .. "}:fences"
    assert.is_false(exists(3, record))
    local lock = assert(srv:client({ db = 3 }):acquire("db:a", 5))
    assert.is_true(exists(3, "lock:{db:a}"))
    assert.is_true(exists(3, record))
    assert.is_false(exists(0, "lock:{db:a}"))
    assert.is_true(lock:release())
  end)

  it("redis://host:port/5 selects db 5", function()
    local lock = assert(redislock.new("redis://127.0.0.1:" .. srv.port .. "/5"):acquire("db:b", 5))
    assert.is_true(exists(5, "lock:{db:b}"))
    assert.is_false(exists(0, "lock:{db:b}"))
    assert.is_true(lock:release())
  end)
end)

describe("a unix socket", function()
  local srv
  lazy_setup(function() srv = helpers.start_redis() end)
  lazy_teardown(function() if srv then srv:stop() end end)

  local function on_unix_socket(client)
    local flags = client_info(client):match("flags=(%S+)")
    return flags ~= nil and flags:find("U", 1, true) ~= nil
  end

  it("path = <socket> works", function()
    local client = redislock.new({ path = srv.sock })
    local lock, err = client:acquire("unix:a", 5)
    assert.truthy(lock, err)
    assert.is_true(on_unix_socket(client))
    assert.is_true(lock:release())
  end)

  it("unix://<socket>?db=2 works and selects db 2", function()
    local client = redislock.new("unix://" .. srv.sock .. "?db=2")
    local lock, err = client:acquire("unix:b", 5)
    assert.truthy(lock, err)
    assert.is_true(on_unix_socket(client))
    assert.equals("1", srv:cli("-n", "2", "EXISTS", "lock:{unix:b}"))
    assert.equals("0", srv:cli("EXISTS", "lock:{unix:b}"))
    assert.is_true(lock:release())
  end)

  it("killed by the server while idle, costs a release and a command nothing, and runs each once", function()
    -- No poll before a command: the write to the closed socket fails, so
    -- nothing was sent, and the call goes again on a fresh connection.
    local client = redislock.new({ path = srv.sock })
    local lock = assert(client:acquire("unix:kill", 5))
    local id = client_id(client)
    assert.equals("1", srv:cli("CLIENT", "KILL", "ID", tostring(id)))
    assert.is_true(lock:release())
    assert.equals("0", srv:cli("EXISTS", "lock:{unix:kill}"))
    assert.are_not.equal(id, client_id(client))
    assert.equals(1, client:command("INCR", "unix:counter"))
    assert.equals("1", srv:cli("CLIENT", "KILL", "ID", tostring(client_id(client))))
    assert.equals(2, client:command("INCR", "unix:counter"))
  end)
end)

describe("fork()", function()
  local srv, P
  lazy_setup(function()
    P = process_functions()
    srv = helpers.start_redis()
  end)
  lazy_teardown(function() if srv then srv:stop() end end)

  it("gives the child its own connection and leaves the parent's alone", function()
    local client = srv:client()
    local held = assert(client:acquire("fork:parent", 5))
    assert.is_true(assert(client:acquire("fork:general", 5, {})):release()) -- its token's tail made before the fork
    local parent_id = client_id(client)
    local report = os.tmpname()

    local pid = assert(P.fork())
    if pid == 0 then
      -- The child must never return into busted: whatever happens, _exit.
      local ok, msg = pcall(function()
        local lock, err = client:acquire("fork:child", 5)
        if not lock then return "child acquire failed: " .. tostring(err) end
        local named = tonumber(lock.token:match("/(%d+)/%d+$"))
        if named ~= core.getpid() then return "the child's token names pid " .. tostring(named) end
        local general = client:acquire("fork:child:general", 5, {}) -- a token of the general path's maker
        named = general and tonumber(general.token:match("/(%d+)/%d+$"))
        if named ~= core.getpid() then return "the child's general token names pid " .. tostring(named) end
        general:release()
        local id = client_id(client)
        if id == parent_id then return "the child reused the parent's connection (CLIENT ID " .. id .. ")" end
        local released, rerr = lock:release()
        if not released then return "child release failed: " .. tostring(rerr) end
        return "ok " .. lock.fence
      end)
      pcall(function()
        local f = io.open(report, "w")
        f:write(ok and msg or "child raised: " .. tostring(msg))
        f:close()
      end)
      P._exit(ok and msg:match("^ok %d+$") and 0 or 1)
    end

    local _, how, code = P.wait(pid)
    local said = helpers.read_file(report) or "(no report)"
    os.remove(report)
    assert.equals("exited", how)
    assert.equals(0, code, said)
    local child_fence = tonumber(said:match("^ok (%d+)$"))
    assert.is_truthy(child_fence, said)

    -- The parent's connection is the one it had, and still in step.
    assert.equals(parent_id, client_id(client))
    assert.is_true(held:release())
    local lock = assert(client:acquire("fork:child", 5))
    assert.is_true(lock.fence > child_fence, lock.fence .. " > " .. child_fence) -- the next holder's
    assert.is_true(lock:release())
    assert.equals(parent_id, client_id(client))
  end)
end)

describe("a closed client", function()
  local srv
  lazy_setup(function() srv = helpers.start_redis() end)
  lazy_teardown(function() if srv then srv:stop() end end)

  it("raises on use, and its connection is gone from the server", function()
    local client = srv:client()
    assert(client:acquire("closed", 5)):release()
    local id = client_id(client)
    client:close()
    client:close() -- closing again is harmless

    local ok, err = pcall(client.acquire, client, "closed", 5)
    assert.is_false(ok)
    assert.matches("closed", err)
    ok, err = pcall(client.with_lock, client, "closed", 5, function() end)
    assert.is_false(ok)
    assert.matches("closed", err)
    assert.matches("closed", tostring(client))

    assert.truthy(helpers.eventually(2, function()
      return srv:cli("CLIENT", "LIST", "ID", tostring(id)) == ""
    end), "the server still lists client " .. id)
  end)
end)

-- Connections under OpenResty, in a real nginx with the lua module: by
-- token, NOSCRIPT, an ACL user and a db, a unix socket, the examples, and
-- the default client from REDIS_URL. The handlers are
-- spec/support/ngx_app.lua's. LuaJIT pass only (nginx loads that build).
describe("connections under OpenResty", function()
  if helpers.no_nginx(pending) then return end

  local srv, raw

  helpers.redis_for(function(s, r) srv, raw = s, r end, { flush = true })
  lazy_setup(function()
    assert(raw:command("ACL", "SETUSER", "locker", "on", ">s3cret", "~*", "&*", "+@all"))
  end)

  local ngx = helpers.app_nginx_for(function() return srv end, 1)

  it("releases by key and token, and refuses a token that is not the holder's", function()
    local status, body = http.request(ngx.port, "GET", "/acquire?key=svc&ttl=30")
    assert.are.equal(200, status, body)
    local fence, token = body:match("^(%d+) (%S+)\n$")
    assert.is_truthy(fence, body)
    assert.are.equal(token, raw:command("GET", "lock:{svc}"))
    assert.are.equal(tonumber(fence), select(2, helpers.fence_record(raw, "svc")))
    local wrong = ("0"):rep(32)
    status, body = http.request(ngx.port, "GET", "/release?key=svc&token=" .. wrong)
    assert.are.equal(409, status)
    assert.is_truthy(body:match("^lost: "), body)
    status = http.request(ngx.port, "GET", "/release?key=svc&token=" .. token)
    assert.are.equal(200, status)
    assert.are.equal(0, raw:command("EXISTS", "lock:{svc}"))
  end)

  it("falls back to EVAL when the server lost its script cache", function()
    assert.are.equal(200, (http.request(ngx.port, "GET", "/acquire?key=a&ttl=1")))
    assert.are.equal("OK", raw:command("SCRIPT", "FLUSH"))
    local status, body = http.request(ngx.port, "GET", "/acquire?key=b&ttl=1")
    assert.are.equal(200, status, body)
  end)

  it("authenticates as an ACL user and selects the db on new connections", function()
    local status, body = http.request(ngx.port, "GET", "/auth/acquire?key=authed&ttl=30")
    assert.are.equal(200, status, body)
    assert.are.equal(0, raw:command("EXISTS", "lock:{authed}"))
    assert.are.equal("OK", raw:command("SELECT", 3))
    assert.are.equal(1, raw:command("EXISTS", "lock:{authed}"))
    assert.are.equal("OK", raw:command("SELECT", 0))
    status, body = http.request(ngx.port, "GET", "/badauth/acquire?key=k")
    assert.are.equal(502, status)
    assert.is_truthy(body:match("^redis: AUTH refused by 127%.0%.0%.1:%d+: WRONGPASS"), body)
    assert.are.equal("redis", core.error_class((body:gsub("\n$", "")))) -- as the C transport's
  end)

  it("talks over a unix socket", function()
    local status, body = http.request(ngx.port, "GET", "/unix/acquire?key=u&ttl=30")
    assert.are.equal(200, status, body)
    assert.are.equal(1, raw:command("EXISTS", "lock:{u}"))
  end)

  it("examples/openresty/run.sh: every example does what it says", function()
    local out, ok = helpers.run("sh " .. helpers.sh_quote(helpers.root() .. "/examples/openresty/run.sh"))
    assert.is_true(ok, out)
    assert.is_truthy(out:find("stampede:  20 concurrent GET /report (2 workers): 20 x 200, 1 rebuild", 1, true), out)
    assert.is_truthy(out:find("ok: every example did what it says", 1, true), out)
  end)

  it("runs redislock.with_lock on the default client from REDIS_URL", function()
    local status, body = http.request(ngx.port, "GET", "/module")
    assert.are.equal(200, status, body)
    local fence, rest = body:match("^(%d+) (.*)$")
    assert.is_truthy(fence, body)
    assert.are.equal("redislock.Client (127.0.0.1:" .. srv.port .. ", cosockets)\n", rest)
    assert.are.equal(tonumber(fence), select(2, helpers.fence_record(raw, "module")))
  end)
end)
