-- SPDX-License-Identifier: MIT
-- Bad input, for every public function: a clear error naming the argument,
-- raised at once, never a crash, a hang or a silently wrong lock.
local core = require("redislock.core")
local redislock = require("redislock")
local helpers = require("spec.helpers")

-- Asserts that fn(...) raises an error whose message contains `text`.
local function raises(text, fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error containing: " .. text)
  assert.is_string(err)
  assert.is_truthy(err:find(text, 1, true), "got: " .. tostring(err) .. "\nwanted: " .. text)
end

describe("argument checks", function()
  local srv, client, lock

  lazy_setup(function()
    srv = helpers.start_redis()
    client = srv:client()
    lock = assert(client:acquire("held", 30))
  end)
  lazy_teardown(function()
    client:close()
    srv:stop()
  end)

  describe("redislock.new", function()
    it("refuses options that are not a table or URL", function()
      raises("bad argument #1 to 'new' (options must be a table, got number)", redislock.new, 42)
      raises("unknown option \"hots\"", redislock.new, { hots = "x" })
      raises("(unknown option 1)", redislock.new, { "redis://x" })
      raises("bad argument #2 to 'new' (no more than 1 argument expected, got 2)", redislock.new, {}, {})
    end)

    it("checks each option's type and range", function()
      local cases = {
        { { host = 1 }, "option 'host' must be a string, got number" },
        { { port = 0 }, "option 'port' must be a whole number in 1..65535, got 0)" },
        { { port = 65536 }, "option 'port' must be a whole number in 1..65535, got 65536)" },
        { { port = 6379.5 }, "option 'port' must be a whole number in 1..65535, got 6379.5)" },
        { { port = "6379" }, "option 'port' must be a whole number in 1..65535, got \"6379\")" },
        { { db = -1 }, "option 'db' must be a whole number in 0..1000000, got -1)" },
        { { db = 0.5 }, "option 'db' must be a whole number in 0..1000000, got 0.5)" },
        { { db = 2000000 }, "option 'db' must be a whole number in 0..1000000, got 2000000)" },
        { { url = "redis://h:6379/2000000" }, "the URL's database must be a whole number in 0..1000000, got 2000000)" },
        { { url = "redis://h", path = "/p" },
          "option 'path' cannot replace the address of a redis:// URL in option 'url'" },
        { { url = "unix:///p", host = "h" },
          "option 'host' cannot replace the address of a unix:// URL in option 'url'" },
        { { timeout = 0 }, "option 'timeout' must be > 0" },
        { { timeout = 0 / 0 }, "option 'timeout' must be a number, not NaN" },
        { { connect_timeout = math.huge }, "option 'connect_timeout' must be finite" },
        { { connect_timeout = "1" }, "option 'connect_timeout' must be a number, got string" },
        { { prefix = false }, "option 'prefix' must be a string, got boolean" },
        { { username = "u" }, "option 'username' needs a 'password'" },
        { { host = "h", path = "/p" }, "options 'host' and 'path' exclude each other" },
        { { host = "" }, "option 'host' must not be empty" },
        { { path = "" }, "option 'path' must not be empty" },
        { { password = {} }, "option 'password' must be a string, got table" },
        { { host = "a\0b" }, "option 'host' must not contain NUL bytes" },
        { { url = "redis://:p%00w@h" }, "option 'password' must not contain NUL bytes" },
        { { timeout = 86401 }, "option 'timeout' must be at most 86400 (one day)" },
        { { prefix = "x{}" }, "option 'prefix' must not contain '{' or '}'" },
        { { prefix = "{app}:" }, "option 'prefix' must not contain '{' or '}'" },
        { { pool_size = 0 }, "option 'pool_size' must be a whole number in 1..1000000, got 0)" },
        { { pool_size = 2.5 }, "option 'pool_size' must be a whole number in 1..1000000, got 2.5)" },
        { { pool_size = 2000000 }, "option 'pool_size' must be a whole number in 1..1000000, got 2000000)" },
        { { keepalive_timeout = -1 }, "option 'keepalive_timeout' must be > 0" },
        { { keepalive_timeout = 86401 }, "option 'keepalive_timeout' must be at most 86400 (one day)" },
        -- Redlock's servers are checked as the client's own address is.
        { { redlock = { "redis://h:1", { host = "h", username = "u" }, "redis://h:3" } },
          "option 'redlock' item 2: username needs a 'password'" },
        { { redlock = { "redis://h:1", "redis://h:2", { host = "", port = 3 } } },
          "option 'redlock' item 3: host must not be empty" },
        { { redlock = { "redis://h:1", "redis://h:2", { host = "h", port = 70000 } } },
          "option 'redlock' item 3: port must be a whole number in 1..65535" },
      }
      for _, c in ipairs(cases) do
        raises("bad argument #1 to 'new' (" .. c[2], redislock.new, c[1])
      end
    end)

    it("reads URLs and says what is wrong with a bad one", function()
      local cases = {
        { "http://x", "must start with redis://, rediss:// or unix://" },
        { "redis://h:abc", "has a host and port that cannot be read" },
        { "redis://h/x", "must end in /<db number>" },
        { "redis://secret@h", "needs a ':' before the password" },
        { "unix://relative.sock", "needs an absolute path" },
        { "unix:///s.sock?db=x", "has a database that is not a whole number" },
        { "unix:///s.sock?tls=1", "has an unknown parameter \"tls\"" },
        { "localhost:6379", "must start with redis://" },
      }
      for _, c in ipairs(cases) do
        raises("bad argument #1 to 'new' (option 'url' " .. c[2], redislock.new, { url = c[1] })
      end
      assert.is_truthy(tostring(redislock.new("redis://[::1]:7000/2")):find("[::1]:7000", 1, true))
      assert.is_truthy(tostring(redislock.new("redis://h")):find("h:6379", 1, true))
      assert.is_truthy(tostring(redislock.new("unix:///x.sock")):find("unix:/x.sock", 1, true))
      -- Explicit fields win over the URL's (an address of the same kind: see above).
      assert.is_truthy(tostring(redislock.new({ url = "redis://h:1", port = 2 })):find("h:2", 1, true))
      assert.is_truthy(tostring(redislock.new({ url = "redis://h:1", host = "k" })):find("k:1", 1, true))
      assert.is_truthy(tostring(redislock.new({ url = "unix:///x.sock", path = "/s" })):find("unix:/s", 1, true))
    end)
  end)

  describe("client:acquire", function()
    it("wants to be called with ':'", function()
      raises("bad self to 'acquire' (redislock client expected, got string; call it with ':'",
             client.acquire, "k", 5)
    end)

    it("checks the key", function()
      raises("bad argument #1 to 'acquire' (key must be a string, got nil)", client.acquire, client)
      raises("bad argument #1 to 'acquire' (key must be a string, got number)", client.acquire, client, 42, 5)
      raises("bad argument #1 to 'acquire' (key must not be empty)", client.acquire, client, "", 5)
      raises("bad argument #1 to 'acquire' (key must not start with '}')", client.acquire, client, "}k", 5)
    end)

    it("checks the ttl", function()
      local cases = {
        { nil, "ttl must be a number, got nil" }, { "5", "ttl must be a number, got string" },
        { 0, "ttl must be > 0" }, { -1, "ttl must be > 0" }, { 0 / 0, "ttl must be a number, not NaN" },
        { math.huge, "ttl must be finite" }, { 1e-5, "ttl must be at least 0.001" },
        { 1e13, "ttl must be at most 9007199254740.992 (2^53 ms, about 285,000 years)" },
      }
      for _, c in ipairs(cases) do
        raises("bad argument #2 to 'acquire' (" .. c[2], client.acquire, client, "k", c[1])
      end
    end)

    it("checks the options", function()
      raises("bad argument #3 to 'acquire' (options must be a table, got number)", client.acquire, client, "k", 5, 2)
      raises("bad argument #3 to 'acquire' (unknown option \"wiat\")", client.acquire, client, "k", 5, { wiat = 1 })
      for _, w in ipairs({ -1, 0 / 0, math.huge, 2 ^ 53, "1", true }) do
        raises("bad argument #3 to 'acquire' (option 'wait' must be a number of seconds in "
               .. "0..9007199254740.992 (2^53 ms))", client.acquire, client, "k", 5, { wait = w })
      end
      raises("bad argument #3 to 'acquire' (option 'wait_mode' must be \"notify\" or \"poll\", got \"spin\")",
             client.acquire, client, "k", 5, { wait_mode = "spin" })
      raises("bad argument #3 to 'acquire' (option 'wait_mode' must be \"notify\" or \"poll\", got 1)",
             client.acquire, client, "k", 5, { wait_mode = 1 })
      raises("bad argument #3 to 'acquire' (option 'replicas' must be a whole number in 1..1000000, got 2000000)",
             client.acquire, client, "k", 5, { replicas = 2000000 })
      raises("bad argument #3 to 'acquire' (option 'fair' must be a boolean, got string)",
             client.acquire, client, "k", 5, { fair = "yes" })
      raises("bad argument #4 to 'with_lock' (option 'fair' must be a boolean, got number)",
             client.with_lock, client, "k", 5, function() end, { fair = 1 })
      raises("bad argument #3 to 'acquire' (option 'handoff' must be a boolean, got string)",
             client.acquire, client, "k", 5, { handoff = "no" })
      raises("bad argument #3 to 'acquire' (option 'handoff' cannot be false with 'fair' (a fair lock goes to its"
             .. " first waiter))", client.acquire, client, "k", 5, { handoff = false, fair = true })
    end)

    it("refuses surplus arguments", function()
      raises("bad argument #4 to 'acquire' (no more than 3 arguments expected, got 4)",
             client.acquire, client, "k", 5, nil, "surplus")
    end)

    it("points argument errors at the caller's line", function()
      local ok, err = pcall(function()
        local l = client:acquire("k", -1)
        return l
      end)
      assert.is_false(ok)
      assert.is_truthy(err:match("06%-arguments_spec%.lua:%d+: bad argument #2 to 'acquire'"), err)
    end)
  end)

  describe("with_lock", function()
    local fn = function() end
    it("checks key, ttl, fn and options, on the client and the module", function()
      for _, f in ipairs({
        function(...) return client:with_lock(...) end,
        function(...) return redislock.with_lock(...) end,
      }) do
        raises("bad argument #1 to 'with_lock' (key must not be empty)", f, "", 5, fn)
        raises("bad argument #2 to 'with_lock' (ttl must be > 0)", f, "k", 0, fn)
        raises("bad argument #3 to 'with_lock' (function expected, got nil)", f, "k", 5)
        raises("bad argument #3 to 'with_lock' (function expected, got string)", f, "k", 5, "fn")
        raises("bad argument #4 to 'with_lock' (unknown option \"ttl\")", f, "k", 5, fn, { ttl = 1 })
        raises("bad argument #5 to 'with_lock' (no more than 4 arguments expected, got 5)", f, "k", 5, fn, nil, 1)
      end
      raises("bad self to 'with_lock'", client.with_lock, "k", 5, fn)
    end)
  end)

  describe("lock methods", function()
    it("check their arguments and self", function()
      raises("bad argument #1 to 'extend' (ttl must be > 0)", lock.extend, lock, 0)
      raises("bad argument #1 to 'extend' (ttl must be a number, got nil)", lock.extend, lock)
      raises("bad self to 'release' (redislock lock expected, got nil", lock.release)
      raises("bad self to 'ttl' (redislock lock expected, got table", lock.ttl, {})
      raises("bad self to 'extend' (redislock lock expected, got table", lock.extend, client, 1)
      raises("bad argument #1 to 'ttl' (no more than 0 arguments expected, got 1)", lock.ttl, lock, "x")
      raises("bad argument #2 to 'extend' (no more than 1 argument expected, got 2)", lock.extend, lock, 1, 2)
      raises("bad argument #1 to 'release' (no more than 0 arguments expected, got 1)", lock.release, lock, true)
      -- Nothing above touched the held lock.
      assert.is_truthy(lock:ttl())
    end)
  end)

  describe("client:from_token", function()
    it("checks the key and the token", function()
      local f = client.from_token
      raises("bad argument #1 to 'from_token' (key must be a string, got nil)", f, client)
      raises("bad argument #2 to 'from_token' (token must be a string, got number)", f, client, "k", 1)
      local bad = "bad argument #2 to 'from_token' (token must be 32 lowercase hex digits (and who holds it,"
                  .. " after a '/'), as lock.token)"
      raises(bad, f, client, "k", "abc")
      raises(bad, f, client, "k", ("X"):rep(32))
      raises(bad, f, client, "k", ("a"):rep(32) .. "x")
      raises(bad, f, client, "k", ("a"):rep(32) .. "/a b")
      assert.are.equal(("a"):rep(32) .. "/h/1/2", f(client, "k", ("a"):rep(32) .. "/h/1/2").token)
      raises("bad argument #3 to 'from_token' (no more than 2 arguments expected, got 3)",
             f, client, "k", lock.token, 1)
      raises("bad self to 'from_token'", f, nil, "k", lock.token)
    end)
  end)

  describe("a closed client", function()
    it("refuses every call with a clear error", function()
      local c = srv:client()
      local l = assert(c:acquire("closing", 5))
      c:close()
      raises("client is closed", c.acquire, c, "k", 5)
      raises("client is closed", c.with_lock, c, "k", 5, function() end)
      raises("bad self to 'command' (client is closed)", c.command, c, "PING")
      raises("client is closed", c.from_token, c, "k", l.token)
      c:close() -- closing twice is harmless
      assert.is_truthy(tostring(c):find("closed", 1, true))
    end)

    it("leaves its locks answering a connection error, check() included", function()
      local c = srv:client()
      local l = assert(c:acquire("closed", 5))
      c:close()
      local want = 'connection: the lock\'s client is closed; "closed" runs out by its TTL'
      local calls = {
        function() return l:release() end, function() return l:extend(5) end, function() return l:ttl() end,
        function() return l:check() end, function() return l:check(true) end,
      }
      for _, call in ipairs(calls) do
        local ok, v, err = pcall(call)
        assert.is_true(ok, v)
        assert.is_nil(v)
        assert.are.equal(want, err)
      end
      assert.is_truthy(srv:cli("GET", "lock:{closed}") == l.token, "close released the lock")
      assert.are.equal("1", srv:cli("DEL", "lock:{closed}"))
    end)
  end)

  describe("messages", function()
    it("say when the holder is this very client (locks are not reentrant)", function()
      local c = srv:client()
      local l = assert(c:acquire("rec", 5))
      local none, err = c:acquire("rec", 5)
      assert.is_nil(none)
      assert.is_truthy(err:match('^busy: "rec" is held by this client %(locks are not reentrant; [%d.]+ s left%)$'),
                       err)
      none, err = c:acquire("rec", 5, { wait = 0.05 })
      assert.is_nil(none)
      assert.is_truthy(err:match('^busy: "rec" is still held by this client after waiting'), err)
      local ok, raised = pcall(c.with_lock, c, "rec", 5, function() end)
      assert.is_false(ok)
      assert.is_truthy(raised:match('^busy: "rec" is held by this client'), raised)
      -- Another client's view is the usual one.
      local other = srv:client()
      none, err = other:acquire("rec", 5)
      assert.is_nil(none)
      assert.is_truthy(err:match('^busy: "rec" is held by another owner'), err)
      assert.is_true(l:release())
      -- Released: whoever holds it next is another owner again.
      assert(other:acquire("rec", 5))
      none, err = c:acquire("rec", 5)
      assert.is_nil(none)
      assert.is_truthy(err:match('^busy: "rec" is held by another owner'), err)
      other:close()
      c:close()
    end)

    it("say when this caller's own hold keeps its read-write lock out", function()
      local c, other = srv:client(), srv:client()
      local rw = c:rwlock("doc")
      local r = assert(rw:read(5))
      local none, err = rw:write(5)
      assert.is_nil(none)
      local _
      assert.is_truthy(err:match('^busy: read%-write lock "doc" is held by a writer or readers %(write; this caller '
                                 .. 'holds a read lock on it, which does not turn into the write lock: release it '
                                 .. 'first; [%d.]+ s left%)$'), err)
      _, err = other:rwlock("doc"):write(5) -- another client: no hint
      assert.is_truthy(err:match('^busy: read%-write lock "doc" is held by a writer or readers '
                                 .. '%(write; [%d.]+ s left%)$'), err)
      assert(r:release())
      local w = assert(c:rwlock("doc"):write(5))
      for _, take in ipairs({ "read", "write" }) do
        _, err = rw[take](rw, 5)
        assert.is_truthy(err:find("(" .. take .. "; this caller holds its write lock: locks are not reentrant; ", 1,
                                  true), err)
      end
      assert(w:release())
      local theirs = assert(other:rwlock("doc"):write(5))
      _, err = rw:read(5) -- released: no hint
      assert.is_truthy(err:match('%(read; [%d.]+ s left%)$'), err)
      assert(theirs:release())
      other:close()
      c:close()
    end)

    it("cut long keys and escape bytes that are not text", function()
      local c = srv:client()
      local long = ("k"):rep(1024 * 1024)
      assert(c:acquire(long, 5))
      local _, err = c:acquire(long, 5)
      assert.is_true(#err < 200, #err)
      assert.is_truthy(err:find('"' .. ("k"):rep(64) .. '"... (1048576 bytes)', 1, true), err)
      assert(c:acquire("bin\0\1\255\n", 5))
      _, err = c:acquire("bin\0\1\255\n", 5)
      assert.is_truthy(err:find('"bin\\x00\\x01\\xff\\n"', 1, true), err)
      assert(c:acquire("заказ", 5))
      _, err = c:acquire("заказ", 5)
      assert.is_truthy(err:find('"заказ"', 1, true), err)
      c:close()
    end)

    it("call a reply nested deeper than hiredis reads a redis error, and go on", function()
      local c = srv:client()
      local none, err = c:command("EVAL", "local t=1 for i=1,20 do t={t} end return t", 0)
      assert.is_nil(none)
      assert.is_truthy(err:match("^redis: the reply of 127%.0%.0%.1:%d+ nests arrays deeper than hiredis 0%.14 "
                                 .. "can read"), err)
      assert.are.equal("PONG", c:command("PING"))
      c:close()
    end)
  end)

  describe("client:command", function()
    it("refuses commands that would change the connection under the locks", function()
      for _, cmd in ipairs({ { "SELECT", 7 }, { "multi" }, { "SUBSCRIBE", "x" }, { "AUTH", "pw" },
                             { "CLIENT", "REPLY", "OFF" }, { "MONITOR" }, { "RESET" } }) do
        raises("bad argument #1 to 'command' (\"" .. cmd[1] .. "\" would change the connection's state",
               client.command, client, (table.unpack or unpack)(cmd))
      end
      raises("bad argument #2 to 'command' (string or number expected, got table)",
             client.command, client, "GET", {})
      raises("bad argument #1 to 'command' (command name expected)", client.command, client)
      -- Past eight arguments they are checked all the same, and a name is
      -- refused however often it was seen, in any case.
      local ok, err = pcall(function()
        local r = client:command("DEL", "a", "b", "c", "d", "e", "f", "g", "h", "i", true)
        return r
      end)
      assert.is_false(ok)
      assert.is_truthy(err:match("06%-arguments_spec%.lua:%d+: bad argument #11 to 'command' %(string or number "
                                 .. "expected, got boolean%)"), err)
      ok, err = pcall(function()
        local r = client:command("SET", "k", nil)
        return r
      end)
      assert.is_false(ok)
      assert.is_truthy(err:match("06%-arguments_spec%.lua:%d+: bad argument #3 to 'command' %(string or number "
                                 .. "expected, got nil%)"), err)
      raises("bad self to 'command' (redislock client expected, got string", client.command, "x", "PING")
      assert.are.equal(0, client:command("DEL", "a", "b", "c", "d", "e", "f", "g", "h", "i", 10))
      for _ = 1, 2 do
        raises("\"select\" would change the connection's state", client.command, client, "select", 1)
        raises("\"client\" would change the connection's state", client.command, client, "client", "reply", "skip")
      end
      ok, err = pcall(function()
        local r = client:command(true)
        return r
      end)
      assert.is_false(ok)
      assert.is_truthy(err:match("06%-arguments_spec%.lua:%d+: bad argument #1 to 'command'"), err)
      -- Other CLIENT subcommands and ordinary commands go through.
      assert.is_number(client:command("CLIENT", "ID"))
      assert.are.equal("PONG", client:command("PING"))
      -- Nothing above moved the locks to another db.
      assert.is_truthy(lock:ttl())
    end)
  end)

  describe("the core module, called directly", function()
    it("checks types instead of crashing", function()
      local c = srv:raw()
      raises("bad argument #1 to", core.new, "x")
      raises("table expected, got string", core.new, "x")
      raises("field 'port' must be an integer in 1..65535", core.new, { port = 1.5 })
      raises("field 'host' must be a string", core.new, { host = 1 })
      raises("must not contain NUL", core.new, { host = "a\0b" })
      raises("invalid option 'steal'", c.eval, c, "steal", "k", "t")
      raises("key must not be empty", c.eval, c, "acquire", "", "t", 10)
      raises("token must not be empty", c.eval, c, "release", "k", "")
      raises("ttl must be an integer number of milliseconds", c.eval, c, "acquire", "k", "t", 1.5)
      raises("ttl must be an integer number of milliseconds", c.eval, c, "extend", "k", "t", 0)
      raises("ttl must be an integer number of milliseconds", c.eval, c, "extend", "k", "t")
      raises("command name expected", c.command, c)
      raises("string or number expected, got table", c.command, c, "GET", {})
      raises("redislock.Client expected", c.eval, {}, "pttl", "k", "t")
      raises("seconds must be in", core.sleep, -1)
      raises("seconds must be in", core.sleep, 0 / 0)
      raises("number expected", core.sleep, "x")
      -- And after all of that the client still works.
      assert.are.equal("PONG", c:command("PING"))
      local nilreply = c:command("GET", "no such key")
      assert.is_false(nilreply)
      local ok, err = c:command("NO-SUCH-COMMAND")
      assert.is_nil(ok)
      assert.is_truthy(err:match("^redis: ERR unknown command"), err)
      c:close()
    end)
  end)
end)
