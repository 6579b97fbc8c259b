-- SPDX-License-Identifier: MIT
-- A failed acquire leaves no lock behind (issue 53): when a step after the
-- first try is refused (a user without +info, one without +eval +evalsha,
-- a server with INFO renamed away), acquire fails with a message naming
-- the command the library needs, and the key it may have taken is given
-- back at once: the same client, another one and an administrator take it
-- next, not after its TTL. Real ACL users made from the README's own line
-- with rights taken away, and a real server started with INFO renamed.
local core = require "redislock.core"
local helpers = require "spec.helpers"
local http = require "spec.support.http"

local PASSWORD = "s3cret"
local TTL = 30 -- long: a lock left behind would still be there when checked

-- The README's ACL SETUSER line for the lock client (the first one in its
-- ACL section), as a list of arguments, with the words in without dropped.
local function readme_user(name, without)
  local readme = assert(io.open(helpers.spec_dir .. "../README.md")):read("a")
  local section = assert(readme:match("\n## A Redis user of its own %(ACL%)\n(.-)\n## "), "the README's ACL section")
  local line = assert(section:match("\nredis%-cli (ACL SETUSER [^\n#]+)"))
  local words = {}
  for word in line:gmatch("%S+") do
    word = word:gsub("^'(.*)'$", "%1")
    if word == "locker" then word = name end
    if word == ">CHANGE-ME" then word = ">" .. PASSWORD end
    if not without[word] then words[#words + 1] = word end
  end
  for w in pairs(without) do assert(line:find(w, 1, true), w .. " is not in the README's line") end
  return words
end

local unpack = table.unpack or unpack -- luacheck: ignore (LuaJIT's global)

-- Asserts that nothing of a failed acquire of key is left: no lock key, no
-- permit, no read or write hold; and that another client takes it at once.
local function nothing_left(srv, admin, key)
  for _, suffix in ipairs({ "", ":permits", ":rw:readers", ":rw:writer" }) do
    local name = "lock:{" .. key .. "}" .. suffix
    local kind = srv:cli("TYPE", name)
    if kind == "zset" then
      assert.are.equal("0", srv:cli("ZCARD", name), name .. " keeps a member")
    else
      assert.are.equal("none", kind, name .. " is left behind")
    end
  end
  local lock, err = admin:acquire(key, 5)
  assert(lock, err)
  assert(lock:release())
end

describe("an acquire refused after its first try", function()
  local srv, admin

  lazy_setup(function()
    srv = helpers.start_redis()
    admin = srv:client({ timeout = 2 })
  end)
  lazy_teardown(function()
    if admin then admin:close() end
    if srv then srv:stop() end
  end)

  it("by a user without +info: names INFO and gives the lock back, for every primitive", function()
    assert.are.equal("OK", srv:cli(unpack(readme_user("noinfo", { ["+info"] = true }))))
    local c = srv:client({ username = "noinfo", password = PASSWORD, timeout = 2 })
    for round = 1, 2 do -- the second on a connection that already failed once
      local key = "noinfo:" .. round
      local lock, err = c:acquire(key, TTL)
      assert.is_nil(lock)
      assert.matches("^redis: ERR The user executing the script can't run this command", err)
      assert.matches("redislock's acquire script calls INFO there: the Redis user needs %+info", err)
      nothing_left(srv, admin, key)
      -- the same client again: refused the same way, never busy
      lock, err = c:acquire(key, TTL, { wait = 0.5 })
      assert.is_nil(lock)
      assert.matches("calls INFO there", err)
      nothing_left(srv, admin, key)
    end
    local ok, raised = pcall(c.with_lock, c, "noinfo:w", TTL, function() end)
    assert.is_false(ok)
    assert.matches("calls INFO there", tostring(raised))
    nothing_left(srv, admin, "noinfo:w")
    -- without +watch as well: the release script gives it back
    assert.are.equal("OK", srv:cli(unpack(readme_user("noinfo2", { ["+info"] = true, ["+watch"] = true }))))
    local c2 = srv:client({ username = "noinfo2", password = PASSWORD, timeout = 2 })
    local lock, err = c2:acquire("noinfo:2", TTL)
    assert.is_nil(lock)
    assert.matches("calls INFO there", err)
    assert.is_nil(err:find("TTL runs out", 1, true))
    nothing_left(srv, admin, "noinfo:2")
    c2:close()
    local permit, perr = c:semaphore("noinfo:s", 2):acquire(TTL)
    assert.is_nil(permit)
    assert.matches("sem_acquire script calls INFO there", perr)
    nothing_left(srv, admin, "noinfo:s")
    c:close()
  end)

  it("by a user without +eval +evalsha: names EVALSHA and gives the lock back without a script", function()
    assert.are.equal("OK", srv:cli(unpack(readme_user("noeval", { ["+eval"] = true, ["+evalsha"] = true }))))
    local c = srv:client({ username = "noeval", password = PASSWORD, timeout = 2 })
    for _, key in ipairs({ "noeval:1", "noeval:1", "noeval:2" }) do
      local lock, err = c:acquire(key, TTL)
      assert.is_nil(lock)
      assert.are.equal("redis: NOPERM this user has no permissions to run the 'evalsha' command; "
                       .. "nothing its first try took is left", err)
      nothing_left(srv, admin, key)
    end
    c:close()
  end)

  it("by a user without +eval +evalsha nor +watch: says the lock may stay until its TTL", function()
    assert.are.equal("OK", srv:cli(unpack(readme_user("bare", { ["+eval"] = true, ["+evalsha"] = true,
                                                                ["+watch"] = true }))))
    local c = srv:client({ username = "bare", password = PASSWORD, timeout = 2 })
    local lock, err = c:acquire("bare:1", TTL)
    assert.is_nil(lock)
    assert.are.equal("redis: NOPERM this user has no permissions to run the 'evalsha' command; "
                     .. '"bare:1" may stay taken by this failed try until its TTL runs out', err)
    c:close()
  end)
end)

describe("a waiting acquire by a user without a right the wait needs (README's table)", function()
  local srv, admin

  lazy_setup(function()
    srv = helpers.start_redis()
    admin = srv:client({ timeout = 2 })
  end)
  lazy_teardown(function()
    if admin then admin:close() end
    if srv then srv:stop() end
  end)

  it("without +blpop: redis: NOPERM at once, never a wait that polls; poll mode needs none", function()
    assert.are.equal("OK", srv:cli(unpack(readme_user("noblpop", { ["+blpop"] = true }))))
    local c = srv:client({ username = "noblpop", password = PASSWORD, timeout = 2 })
    local held = assert(admin:acquire("noblpop:k", 10))
    local t0 = core.now()
    local lock, err = c:acquire("noblpop:k", 5, { wait = 3 })
    assert.is_nil(lock)
    assert.are.equal("redis: NOPERM this user has no permissions to run the 'blpop' command", err)
    assert.is_true(core.now() - t0 < 1.5, "it waited")
    lock, err = c:acquire("noblpop:k", 5, { wait = 0.3, wait_mode = "poll" })
    assert.is_nil(lock)
    assert.matches("^busy: ", err)
    assert(held:release())
    nothing_left(srv, admin, "noblpop:k")
    c:close()
  end)

  it("without +time: a plain lock's waiting acquire fails, naming TIME", function()
    assert.are.equal("OK", srv:cli(unpack(readme_user("notime", { ["+time"] = true }))))
    local c = srv:client({ username = "notime", password = PASSWORD, timeout = 2 })
    local held = assert(admin:acquire("notime:k", 10))
    local lock, err = c:acquire("notime:k", 5, { wait = 1 })
    assert.is_nil(lock)
    assert.matches("calls TIME there: the Redis user needs %+time", err)
    assert(held:release())
    nothing_left(srv, admin, "notime:k")
    c:close()
  end)
end)

describe("an acquire on a server with INFO renamed away", function()
  local srv, admin

  lazy_setup(function()
    srv = helpers.start_redis({ "--rename-command", "INFO", "" })
    admin = srv:client({ timeout = 2 })
  end)
  lazy_teardown(function()
    if admin then admin:close() end
    if srv then srv:stop() end
  end)

  it("names INFO and leaves no lock behind", function()
    local c = srv:client({ timeout = 2 })
    local lock, err = c:acquire("renamed", TTL)
    assert.is_nil(lock)
    assert.matches("^redis: ERR Unknown Redis command called from script", err)
    assert.matches("calls INFO there: the Redis user needs %+info, and the server must not rename INFO away", err)
    assert.are.equal("0", srv:cli("EXISTS", "lock:{renamed}"))
    -- nobody can take it on this server, but nobody finds it busy either
    lock, err = c:acquire("renamed", TTL, { wait = 0.3 })
    assert.is_nil(lock)
    assert.matches("calls INFO there", err)
    assert.are.equal("0", srv:cli("EXISTS", "lock:{renamed}"))
    local rw, rerr = c:rwlock("renamed:rw"):write(TTL)
    assert.is_nil(rw)
    assert.matches("^redis: ", rerr)
    assert.are.equal("0", srv:cli("EXISTS", "lock:{renamed:rw}:rw:writer"))
    c:close()
    assert(core.now())
  end)
end)

describe("OpenResty: an acquire refused after its first try", function()
  if helpers.no_nginx(pending) then return end

  local srv, admin, nginx

  lazy_setup(function()
    srv = helpers.start_redis()
    admin = srv:client({ timeout = 2 })
    assert.are.equal("OK", srv:cli(unpack(readme_user("noinfo", { ["+info"] = true }))))
    assert.are.equal("OK", srv:cli(unpack(readme_user("noeval", { ["+eval"] = true, ["+evalsha"] = true }))))
    local function server(user)
      return table.concat({
        "server {",
        "  listen 127.0.0.1:{{port" .. (user == "noeval" and "2" or "") .. "}};",
        '  set $redis_url "redis://' .. user .. ":" .. PASSWORD .. "@127.0.0.1:" .. srv.port .. '";',
        '  set $redis_timeout "2";',
        "  " .. helpers.location("/acquire", "acquire"),
        "}",
      }, "\n")
    end
    nginx = helpers.start_nginx({ workers = 1, http = server("noinfo") .. "\n" .. server("noeval") })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
    if admin then admin:close() end
    if srv then srv:stop() end
  end)

  it("over cosockets too: names the command and leaves no lock behind", function()
    for round = 1, 2 do -- the second on a pooled connection
      local status, body = http.request(nginx.port, "GET", "/acquire?key=ngx:noinfo&ttl=30")
      assert.are.equal(502, status, body)
      assert.matches("calls INFO there: the Redis user needs %+info", body)
      nothing_left(srv, admin, "ngx:noinfo")
      status, body = http.request(nginx.port2, "GET", "/acquire?key=ngx:noeval&ttl=30")
      assert.are.equal(502, status, body)
      assert.matches("^redis: NOPERM this user has no permissions to run the 'evalsha' command", body)
      nothing_left(srv, admin, "ngx:noeval")
      assert(round)
    end
  end)
end)
