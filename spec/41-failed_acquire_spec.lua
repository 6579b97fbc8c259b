-- SPDX-License-Identifier: MIT
-- A failed acquire leaves no lock behind (issue 53): when a step after the
-- script took the lock is refused (a user without +time: the acquire
-- script takes the lock, then may not read the clock for its fence),
-- acquire fails with a message naming the command the library needs, and
-- the key it took is given back at once: the same client, another one and
-- an administrator take it next, not after its TTL. A refusal of the
-- script's command itself (a user without +eval +evalsha) ran nothing:
-- nothing was taken, nothing is released, and the message says no more.
-- No INFO is read: a user without +info, and a server with INFO renamed
-- away, take and give back every primitive. Real ACL users made from the
-- README's own line with rights taken away, and a real server started with
-- INFO renamed.
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

-- Asserts that nothing of a failed (or released) acquire of key is left: no
-- lock key nor its holder's fence, no permit, no read or write hold, no
-- fence of an earlier version's; and that another client takes it at once.
local function nothing_left(srv, admin, key)
  for _, suffix in ipairs({ "", ":fence", ":permits", ":permits:fence", ":rw:readers", ":rw:writer", ":rw:fence" }) do
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

  it("by a user without +time: names TIME and gives the lock back, for every primitive", function()
    assert.are.equal("OK", srv:cli(unpack(readme_user("notime1", { ["+time"] = true }))))
    local c = srv:client({ username = "notime1", password = PASSWORD, timeout = 2 })
    for round = 1, 2 do -- the second on a connection that already failed once
      local key = "notime:" .. round
      local lock, err = c:acquire(key, TTL)
      assert.is_nil(lock)
      assert.matches("^redis: ERR The user executing the script can't run this command", err)
      assert.matches("redislock's acquire script calls TIME there: the Redis user needs %+time", err)
      assert.is_nil(err:find("TTL runs out", 1, true)) -- the release gave it back
      nothing_left(srv, admin, key)
      -- the same client again: refused the same way, never busy
      lock, err = c:acquire(key, TTL, { wait = 0.5 })
      assert.is_nil(lock)
      assert.matches("calls TIME there", err)
      nothing_left(srv, admin, key)
    end
    local ok, raised = pcall(c.with_lock, c, "notime:w", TTL, function() end)
    assert.is_false(ok)
    assert.matches("calls TIME there", tostring(raised))
    nothing_left(srv, admin, "notime:w")
    local w, werr = c:rwlock("notime:rw"):write(TTL)
    assert.is_nil(w)
    assert.matches("write_acquire script calls TIME there", werr)
    nothing_left(srv, admin, "notime:rw")
    -- A semaphore's permit is a time: refused before it is added (its
    -- release, which needs the clock too, cannot say so).
    local permit, perr = c:semaphore("notime:s", 2):acquire(TTL)
    assert.is_nil(permit)
    assert.matches("sem_acquire script calls TIME there", perr)
    nothing_left(srv, admin, "notime:s")
    c:close()
  end)

  it("by a user without +info: takes and gives back every primitive (no INFO is read)", function()
    assert.are.equal("OK", srv:cli(unpack(readme_user("noinfo", { ["+info"] = true }))))
    local c = srv:client({ username = "noinfo", password = PASSWORD, timeout = 2 })
    for round = 1, 2 do
      local key = "noinfo:" .. round
      local lock = assert(c:acquire(key, TTL))
      assert.are.equal(lock.token, srv:cli("GET", "lock:{" .. key .. "}"))
      assert.is_true(lock:release())
      nothing_left(srv, admin, key)
      lock = assert(c:acquire(key, TTL, { wait = 0.5 }))
      assert.is_true(lock:release())
      nothing_left(srv, admin, key)
    end
    assert.are.equal("ran", c:with_lock("noinfo:w", TTL, function() return "ran" end))
    nothing_left(srv, admin, "noinfo:w")
    local permit = assert(c:semaphore("noinfo:s", 2):acquire(TTL))
    assert.is_true(permit:release())
    nothing_left(srv, admin, "noinfo:s")
    local w = assert(c:rwlock("noinfo:rw"):write(TTL))
    assert.is_true(w:release())
    local r = assert(c:rwlock("noinfo:rw"):read(TTL))
    assert.is_true(r:release())
    nothing_left(srv, admin, "noinfo:rw")
    assert.are.equal("0", srv:cli("INFO", "commandstats"):match("cmdstat_info:calls=(%d+)") or "0")
    c:close()
  end)

  -- Rejected calls of EVALSHA (refused before they ran), as Redis counts them.
  local function evalsha_rejected()
    return tonumber(srv:cli("INFO", "commandstats"):match("cmdstat_evalsha:[^\n]*rejected_calls=(%d+)") or "0")
  end

  it("by a user without +eval +evalsha: refused whole, nothing taken, no release tried", function()
    assert.are.equal("OK", srv:cli(unpack(readme_user("noeval", { ["+eval"] = true, ["+evalsha"] = true }))))
    local c = srv:client({ username = "noeval", password = PASSWORD, timeout = 2 })
    for _, key in ipairs({ "noeval:1", "noeval:1", "noeval:2" }) do
      local before = evalsha_rejected()
      local lock, err = c:acquire(key, TTL)
      assert.is_nil(lock)
      assert.are.equal("redis: NOPERM this user has no permissions to run the 'evalsha' command", err)
      assert.are.equal(before + 1, evalsha_rejected()) -- the acquire's, and no release after it
      assert.are.equal("0", srv:cli("EXISTS", "lock:{" .. key .. "}"))
      nothing_left(srv, admin, key)
    end
    c:close()
  end)

  it("by a user without +eval +evalsha nor +watch: the same", function()
    assert.are.equal("OK", srv:cli(unpack(readme_user("bare", { ["+eval"] = true, ["+evalsha"] = true,
                                                                ["+watch"] = true }))))
    local c = srv:client({ username = "bare", password = PASSWORD, timeout = 2 })
    local before = evalsha_rejected()
    local lock, err = c:acquire("bare:1", TTL)
    assert.is_nil(lock)
    assert.are.equal("redis: NOPERM this user has no permissions to run the 'evalsha' command", err)
    assert.are.equal(before + 1, evalsha_rejected())
    assert.are.equal("0", srv:cli("EXISTS", "lock:{bare:1}"))
    nothing_left(srv, admin, "bare:1")
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

  it("takes and gives back a lock, a waiting one and a read-write lock (no INFO is read)", function()
    local c = srv:client({ timeout = 2 })
    local lock = assert(c:acquire("renamed", TTL))
    assert.are.equal(lock.token, srv:cli("GET", "lock:{renamed}"))
    assert.is_true(lock:release())
    nothing_left(srv, admin, "renamed")
    lock = assert(c:acquire("renamed", TTL, { wait = 0.3 }))
    assert.is_true(lock:release())
    nothing_left(srv, admin, "renamed")
    local rw = assert(c:rwlock("renamed:rw"):write(TTL))
    assert.is_true(rw:release())
    nothing_left(srv, admin, "renamed:rw")
    c:close()
  end)
end)

describe("OpenResty: an acquire without +info, and one refused whole", function()
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
        "  " .. helpers.location("/release", "release"),
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

  it("over cosockets too: without +info it works; without +eval +evalsha nothing is taken", function()
    for round = 1, 2 do -- the second on a pooled connection
      local status, body = http.request(nginx.port, "GET", "/acquire?key=ngx:noinfo&ttl=30")
      assert.are.equal(200, status, body)
      local token = body:match("^%d+ (%S+)\n$")
      assert.are.equal(token, srv:cli("GET", "lock:{ngx:noinfo}"))
      status, body = http.request(nginx.port, "GET", "/release?key=ngx:noinfo&token=" .. token)
      assert.are.equal(200, status, body)
      nothing_left(srv, admin, "ngx:noinfo")
      status, body = http.request(nginx.port2, "GET", "/acquire?key=ngx:noeval&ttl=30")
      assert.are.equal(502, status, body)
      assert.are.equal("redis: NOPERM this user has no permissions to run the 'evalsha' command",
                       (body:gsub("\n$", "")))
      assert.are.equal("0", srv:cli("EXISTS", "lock:{ngx:noeval}"))
      nothing_left(srv, admin, "ngx:noeval")
      assert(round)
    end
  end)
end)
