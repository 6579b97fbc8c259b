-- SPDX-License-Identifier: MIT
-- A failed acquire leaves no lock behind (issue 53). Its first try is a
-- take (MULTI, SET NX PX, XADD of the slot's fence record, EXEC: no
-- script); when the acquire script must follow a take that took the lock
-- (its record's new ID tells no fence: here a record at seq 63, so the
-- take's ID is "<ms>-64") and is refused (a user without +pexpire, which
-- the script runs on the lock it finds ours, or without +eval +evalsha),
-- the call gives the lock back itself (WATCH, GET, MULTI, DEL, EXEC), says
-- "nothing its first try took is left", and no release follows: the same
-- client, another one and an administrator take it next, not after its
-- TTL. A user without +time takes and gives back a plain lock (no script
-- of that reads the clock); a semaphore and a read-write lock fail naming
-- TIME, and leave nothing. A user without +eval +evalsha takes a free
-- plain lock (the take) but cannot release it (a script): the release
-- names EVALSHA, and the lock runs out by its TTL, nothing else left; a
-- busy lock is refused whole, nothing released. No INFO is read: the
-- README's user has no +info, and a server with INFO renamed away takes and
-- gives back every primitive. Real ACL users made from the README's own
-- line with rights taken away, and a real server started with INFO renamed.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")

local PASSWORD = "s3cret"
local TTL = 30 -- long: a lock left behind would still be there when checked

-- The README's ACL SETUSER line for the lock client (the first one in its
-- ACL section), as a list of arguments, with the words in without dropped
-- (each must be in the line).
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

-- Makes the README's user name on srv, without the words in without
-- (readme_user), and returns a client that logs in as it.
local function user_client(srv, name, without)
  assert.are.equal("OK", srv:cli(unpack(readme_user(name, without))))
  return srv:client({ username = name, password = PASSWORD, timeout = 2 })
end

-- Raises the fence record of the slot of key to "<ms>-63" (a minute
-- ahead of the server's clock, or the ms after its last): the next take's
-- ID, "<ms>-64", tells no fence, so the acquire script must follow it
-- (csrc/scripts/README.md, "Fences").
local function untold(srv, key)
  local raw = srv:raw()
  local rec, last = helpers.fence_record(raw, key)
  local t = raw:command("TIME")
  local ms = math.max(tonumber(t[1]) * 1000 + 60000,
                      last and math.floor(last / core.FENCE_SCALE) + core.FENCE_EPOCH_MS + 1 or 0)
  local id = ms .. "-" .. (core.FENCE_SCALE - 1)
  assert.are.equal(id, raw:command("XADD", rec, "MAXLEN", 0, id, "f", 1))
  raw:close()
end

-- EVALSHA calls the server counted (Redis counts a rejected one apart).
local function evalsha_calls(srv)
  local stats = srv:cli("INFO", "commandstats"):match("cmdstat_evalsha:([^\n]*)") or ""
  return tonumber(stats:match("^calls=(%d+)") or "0"), tonumber(stats:match("rejected_calls=(%d+)") or "0")
end

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

-- Takes key's lock over c (with opts) and gives it back: the server held
-- c's token meanwhile, and nothing of it is left after.
local function taken_and_given_back(srv, admin, c, key, opts)
  local lock = assert(c:acquire(key, TTL, opts))
  assert.are.equal(lock.token, srv:cli("GET", "lock:{" .. key .. "}"))
  assert.is_true(lock:release())
  nothing_left(srv, admin, key)
end

-- A redis-server (started with the more arguments extra) and an
-- administrator's client on it (2 s timeout) for the enclosing describe
-- block, stopped after it; ready(srv, admin) keeps them in its locals.
local function server_and_admin(extra, ready)
  local srv, admin
  lazy_setup(function()
    srv = helpers.start_redis(extra)
    admin = srv:client({ timeout = 2 })
    ready(srv, admin)
  end)
  lazy_teardown(function()
    if admin then admin:close() end
    if srv then srv:stop() end
  end)
end

describe("an acquire refused after its first try", function()
  local srv, admin

  server_and_admin(nil, function(s, a) srv, admin = s, a end)

  it("by a user without +pexpire, after a take whose ID tells no fence: names PEXPIRE, gives the lock back itself",
     function()
    local c = user_client(srv, "nopexpire", { ["+pexpire"] = true })
    for round = 1, 2 do -- the second on a connection that already failed once
      local key = "nopexpire:" .. round
      untold(srv, key)
      local calls = evalsha_calls(srv)
      local lock, err = c:acquire(key, TTL)
      assert.is_nil(lock)
      assert.matches("^redis: ERR The user executing the script can't run this command", err)
      assert.matches("redislock's acquire script calls PEXPIRE there: the Redis user needs %+pexpire", err)
      assert.matches("; nothing its first try took is left$", err)
      -- The acquire script, and no release after it: the call gave it back.
      assert.are.equal(calls + 1, (evalsha_calls(srv)))
      nothing_left(srv, admin, key)
      -- the same client again, waiting: refused the same way, never busy
      untold(srv, key)
      lock, err = c:acquire(key, TTL, { wait = 0.5 })
      assert.is_nil(lock)
      assert.matches("calls PEXPIRE there", err)
      nothing_left(srv, admin, key)
    end
    untold(srv, "nopexpire:w")
    local ran = false
    local ok, raised = pcall(c.with_lock, c, "nopexpire:w", TTL, function() ran = true end)
    assert.is_false(ok)
    assert.is_false(ran)
    assert.matches("calls PEXPIRE there", tostring(raised))
    nothing_left(srv, admin, "nopexpire:w")
    -- A take whose ID tells the fence needs no script, and a release with
    -- nobody waiting no PEXPIRE.
    assert(assert(c:acquire("nopexpire:w", TTL)):release())
    nothing_left(srv, admin, "nopexpire:w")
    c:close()
  end)

  it("by a user without +time: a plain lock is taken and given back; a semaphore and a write lock name TIME", function()
    local c = user_client(srv, "notime1", { ["+time"] = true })
    for round = 1, 2 do
      local key = "notime:" .. round
      -- The take, and a release with nobody waiting: no clock read.
      taken_and_given_back(srv, admin, c, key)
      -- A take whose ID tells no fence: the acquire script follows, and
      -- tells one without the clock too.
      untold(srv, key)
      taken_and_given_back(srv, admin, c, key)
    end
    assert.are.equal("ran", c:with_lock("notime:w", TTL, function() return "ran" end))
    nothing_left(srv, admin, "notime:w")
    local w, werr = c:rwlock("notime:rw"):write(TTL)
    assert.is_nil(w)
    assert.matches("write_acquire script calls TIME there: the Redis user needs %+time", werr)
    nothing_left(srv, admin, "notime:rw")
    -- A semaphore's permit is a time: refused before it is added (its
    -- release, which needs the clock too, cannot say so).
    local permit, perr = c:semaphore("notime:s", 2):acquire(TTL)
    assert.is_nil(permit)
    assert.matches("sem_acquire script calls TIME there", perr)
    nothing_left(srv, admin, "notime:s")
    c:close()
  end)

  it("by the README's user, who has no +info: takes and gives back every primitive (no INFO is read)", function()
    for _, word in ipairs(readme_user("noinfo", {})) do
      assert(word ~= "+info" and word ~= "+@all" and word ~= "+incr", word .. " is in the README's line")
    end
    local c = user_client(srv, "noinfo", {})
    assert.are.equal("OK", srv:cli("CONFIG", "RESETSTAT")) -- the INFO of this file's checks before
    for round = 1, 2 do
      local key = "noinfo:" .. round
      taken_and_given_back(srv, admin, c, key)
      taken_and_given_back(srv, admin, c, key, { wait = 0.5 })
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
  local function evalsha_rejected() return select(2, evalsha_calls(srv)) end

  -- Waits for key's lock to run out by its TTL (short here), then checks
  -- that nothing else is left.
  local function runs_out(key)
    assert(helpers.eventually(5, function() return srv:cli("EXISTS", "lock:{" .. key .. "}") == "0" end),
           key .. " never ran out")
    nothing_left(srv, admin, key)
  end

  local NOEVAL = "redis: NOPERM this user has no permissions to run the 'evalsha' command"

  it("by a user without +eval +evalsha: takes a free lock, cannot release it; refused whole where a script must run",
     function()
    local c = user_client(srv, "noeval", { ["+eval"] = true, ["+evalsha"] = true })
    -- Free: the take takes it (no script) and keeps no holder's fence key;
    -- its release is a script, refused: the lock runs out by its TTL.
    local before = evalsha_rejected()
    local lock = assert(c:acquire("noeval:free", 1, { renew = false }))
    assert.is_number(lock.fence)
    assert.are.equal(before, evalsha_rejected())
    assert.are.equal(lock.token, srv:cli("GET", "lock:{noeval:free}"))
    assert.are.equal("0", srv:cli("EXISTS", "lock:{noeval:free}:fence"))
    local ok, err = lock:release()
    assert.is_nil(ok)
    assert.are.equal(NOEVAL, err)
    runs_out("noeval:free")
    -- with_lock runs fn, then raises the release's error; the same.
    local ran = false
    local wok, raised = pcall(c.with_lock, c, "noeval:w", 1, function() ran = true end, { renew = false })
    assert.is_false(wok)
    assert.is_true(ran)
    assert.are.equal(NOEVAL, tostring(raised))
    runs_out("noeval:w")
    -- Busy: the acquire script must follow the take; refused, nothing
    -- taken, no release tried, the holder's lock untouched.
    local held = assert(admin:acquire("noeval:busy", TTL))
    before = evalsha_rejected()
    local none
    none, err = c:acquire("noeval:busy", TTL)
    assert.is_nil(none)
    assert.are.equal(NOEVAL, err)
    assert.are.equal(before + 1, evalsha_rejected())
    assert.are.equal(held.token, srv:cli("GET", "lock:{noeval:busy}"))
    assert(held:release())
    -- A take whose ID tells no fence: the take took it, the script that
    -- must tell its fence is refused, and the call gives the lock back itself.
    for _, key in ipairs({ "noeval:1", "noeval:1", "noeval:2" }) do
      untold(srv, key)
      before = evalsha_rejected()
      none, err = c:acquire(key, TTL)
      assert.is_nil(none)
      assert.are.equal(NOEVAL .. "; nothing its first try took is left", err)
      assert.are.equal(before + 1, evalsha_rejected()) -- the acquire's, and no release after it
      nothing_left(srv, admin, key)
    end
    c:close()
  end)

  it("by a user without +eval +evalsha nor +watch: the take's lock is not given back; its TTL ends it", function()
    local c = user_client(srv, "bare", { ["+eval"] = true, ["+evalsha"] = true, ["+watch"] = true })
    untold(srv, "bare:1")
    local before = evalsha_rejected()
    local lock, err = c:acquire("bare:1", 1)
    assert.is_nil(lock)
    assert.are.equal(NOEVAL, err:sub(1, #NOEVAL))
    assert.is_nil(err:find("nothing its first try took is left", 1, true)) -- WATCH was refused, and EVALSHA
    assert.are.equal(1, select(2, err:gsub("may stay taken by this failed try until its TTL runs out", "")), err)
    assert.are.equal(before + 2, evalsha_rejected()) -- the acquire's, and its release's (the call said it stays)
    runs_out("bare:1")
    c:close()
  end)

  it("by a user without +multi: the take's SET runs alone; the call names MULTI and gives the lock back", function()
    local c = user_client(srv, "nomulti", { ["+multi"] = true })
    local lock, err = c:acquire("nomulti:1", TTL)
    assert.is_nil(lock)
    assert.matches("^redis: NOPERM[^\n]*'multi' command", err)
    assert.is_truthy(err:find("; nothing its first try took is left", 1, true), err)
    nothing_left(srv, admin, "nomulti:1")
    c:close()
  end)

  -- An acquire by c of key after a take whose ID tells no fence, which
  -- must fail: its error, and the EVALSHA calls it made.
  local function refused_untold(c, key)
    untold(srv, key)
    local calls = evalsha_calls(srv)
    local lock, err = c:acquire(key, TTL)
    assert.is_nil(lock, key)
    return err, evalsha_calls(srv) - calls
  end

  it("by a user without +pexpire nor +watch: the call cannot give the take's lock back; the release script does",
     function()
    -- A refusal within the script (not of EVALSHA itself), and WATCH
    -- refused: the call says the lock stays, so the acquire sends its
    -- release, which needs no PEXPIRE. (Without +pexpire alone the call
    -- gives it back, and no release follows: the first case.)
    local c = user_client(srv, "nowatch", { ["+pexpire"] = true, ["+watch"] = true })
    for _, key in ipairs({ "nowatch:1", "nowatch:2" }) do -- the second on a new connection
      local err, sent = refused_untold(c, key)
      assert.matches("calls PEXPIRE there: the Redis user needs %+pexpire", err)
      assert.matches("; nothing its first try took is left$", err) -- after the release; the call said "staying"
      assert.are.equal(2, sent) -- the acquire script, then the release
      nothing_left(srv, admin, key) -- at once, not after its TTL
    end
    c:close()
  end)

  it("by a user without +multi nor +watch: the take's SET runs alone, the call cannot give it back; the release does",
     function()
    -- MULTI refused (class "refused"), the SET taken alone, WATCH refused:
    -- the call says the lock stays, and that, not the class, decides that
    -- the acquire sends its release.
    local c = user_client(srv, "nomultiwatch", { ["+multi"] = true, ["+watch"] = true })
    local calls = evalsha_calls(srv)
    local lock, err = c:acquire("nomultiwatch:1", TTL)
    assert.is_nil(lock)
    assert.matches("^redis: NOPERM[^\n]*'multi' command", err)
    assert.matches("; nothing its first try took is left$", err) -- the release gave it back
    assert.is_nil(err:find("may stay", 1, true), err)
    assert.are.equal(1, evalsha_calls(srv) - calls) -- the release
    nothing_left(srv, admin, "nomultiwatch:1") -- at once, not after its TTL
    c:close()
  end)
end)

describe("a waiting acquire by a user without a right the wait needs (README's table)", function()
  local srv, admin

  server_and_admin(nil, function(s, a) srv, admin = s, a end)

  -- Runs check(c, key) while admin holds the lock on "<name>:k" (c: a
  -- client of the README's user name, without the words in without), then
  -- gives the lock back: nothing of it is left.
  local function while_held(name, without, check)
    local c, key = user_client(srv, name, without), name .. ":k"
    local held = assert(admin:acquire(key, 10))
    check(c, key)
    assert(held:release())
    nothing_left(srv, admin, key)
    c:close()
  end

  it("without +blpop: redis: NOPERM at once, never a wait that polls; poll mode needs none", function()
    while_held("noblpop", { ["+blpop"] = true }, function(c, key)
      local t0 = core.now()
      local lock, err = c:acquire(key, 5, { wait = 3 })
      assert.is_nil(lock)
      assert.are.equal("redis: NOPERM this user has no permissions to run the 'blpop' command", err)
      assert.is_true(core.now() - t0 < 1.5, "it waited")
      lock, err = c:acquire(key, 5, { wait = 0.3, wait_mode = "poll" })
      assert.is_nil(lock)
      assert.matches("^busy: ", err)
    end)
  end)

  it("without +time: a plain lock's waiting acquire fails, naming TIME", function()
    while_held("notime", { ["+time"] = true }, function(c, key)
      local lock, err = c:acquire(key, 5, { wait = 1 })
      assert.is_nil(lock)
      assert.matches("calls TIME there: the Redis user needs %+time", err)
    end)
  end)
end)

describe("an acquire on a server with INFO renamed away", function()
  local srv, admin

  server_and_admin({ "--rename-command", "INFO", "" }, function(s, a) srv, admin = s, a end)

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

describe("OpenResty: an acquire by the README's user (no +info), and one refused whole", function()
  if helpers.no_nginx(pending) then return end

  local srv, admin, nginx

  server_and_admin(nil, function(s, a) srv, admin = s, a end)
  lazy_setup(function()
    assert.are.equal("OK", srv:cli(unpack(readme_user("noinfo", {}))))
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
  end)

  it("over cosockets too: the README's user works; without +eval +evalsha a busy lock is refused whole", function()
    for round = 1, 2 do -- the second on a pooled connection
      local status, body = http.request(nginx.port, "GET", "/acquire?key=ngx:noinfo&ttl=30")
      assert.are.equal(200, status, body)
      local token = body:match("^%d+ (%S+)\n$")
      assert.are.equal(token, srv:cli("GET", "lock:{ngx:noinfo}"))
      status, body = http.request(nginx.port, "GET", "/release?key=ngx:noinfo&token=" .. token)
      assert.are.equal(200, status, body)
      nothing_left(srv, admin, "ngx:noinfo")
      -- Busy for the user without +eval +evalsha: the acquire script must
      -- follow its take, and is refused; nothing taken.
      local held = assert(admin:acquire("ngx:noeval", 30))
      status, body = http.request(nginx.port2, "GET", "/acquire?key=ngx:noeval&ttl=30")
      assert.are.equal(502, status, body)
      assert.are.equal("redis: NOPERM this user has no permissions to run the 'evalsha' command",
                       (body:gsub("\n$", "")))
      assert.are.equal(held.token, srv:cli("GET", "lock:{ngx:noeval}"))
      assert(held:release())
      nothing_left(srv, admin, "ngx:noeval")
      assert(round)
    end
  end)

  it("over cosockets too: a take given back by its call is not released again; one left staying is", function()
    -- The second server's user, given +eval +evalsha back and without
    -- +pexpire: the script after a take whose ID tells no fence is refused.
    assert.are.equal("OK", srv:cli("ACL", "SETUSER", "noeval", "+eval", "+evalsha", "-pexpire"))
    for _, case in ipairs({ { key = "ngx:given", sends = 1, given = true },
                            { key = "ngx:staying", sends = 2, watch = "-watch" } }) do
      if case.watch then assert.are.equal("OK", srv:cli("ACL", "SETUSER", "noeval", case.watch)) end
      untold(srv, case.key)
      local calls = evalsha_calls(srv)
      local status, body = http.request(nginx.port2, "GET", "/acquire?key=" .. case.key .. "&ttl=30")
      assert.are.equal(502, status, body)
      assert.matches("calls PEXPIRE there: the Redis user needs %+pexpire", body)
      -- given back by the call, or by the release that follows it: said once
      assert.are.equal(1, select(2, body:gsub("; nothing its first try took is left", "")), body)
      assert.are.equal(calls + case.sends, (evalsha_calls(srv))) -- the acquire script (and the release)
      nothing_left(srv, admin, case.key)
    end
  end)
end)
