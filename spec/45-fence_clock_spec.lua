-- SPDX-License-Identifier: MIT
-- run.sh: long 40 (its seconds on a loaded 2-core machine, with nginx: 11-60 s seen; spec/run.sh starts it early)
-- Fences that follow the clock (csrc/scripts/README.md, "Fences"): a fence
-- is the number the new ID "<ms>-<seq>" of the slot's fence record (a
-- stream, "<prefix>{<era tag>}:fences") stands for, ms times RL_FENCE_SCALE
-- plus seq; Redis makes the ID from its clock, above the record's last (the
-- take's XADD, or a script's next_fence). So the first fence after each of these is
-- above every fence handed out before it, for a lock, a semaphore's permit,
-- a read-write lock's writer, each key of a multi-key lock and an
-- election's term: the server behind the client's one address killed and
-- started again empty; a failover behind that address undone (the old
-- master named again, never demoted, its data unchanged); a replica
-- promoted before it synced anything. Within one master fences grow with
-- every grant of a slot. Nothing of a name is left once its holds are
-- gone, only the slot records; an earlier version's era records (strings,
-- "...:era") are left to it, and the counters it kept per name are
-- honoured, and go: a lock's at its next release or a script's grant, the
-- others' at their next grant. One topology per describe
-- block, started once; then the same under OpenResty (the LuaJIT pass).
local redislock = require("redislock")
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")

local failover = require("spec.support.failover")

local signal, above, note, take_all = failover.signal, failover.above, failover.note, failover.take_all

-- What an earlier version left (its fences: a per-name counter plus its
-- era's offset, a master's clock in ms): a record of a slot, and the
-- highest fence its counters made.
local LEGACY_ERA = ("5f0c"):rep(10) .. " 1795800188748"
local LEGACY_TOP = 1795800188748 + 123456

-- A master's arguments: its replica's first sync at once (a diskless sync
-- waits 5 s for more replicas by default).
local QUICK_SYNC = { "--repl-diskless-sync-delay", "0" }

-- The names take_all takes in plain Lua: the lock "orders:42" (and the
-- primitives named after it) and the election "orders:42:jobs".
local ORDERS = { lock = "orders:42", election = "orders:42:jobs" }

-- The era record an earlier version kept for the slot of the lock on name
-- (a string; this version's fence record is "...:fences").
local function era_record(name)
  return "lock:{" .. core.era_tag(core.lock_slot(name)) .. "}:era"
end

-- The highest fence in t (name -> fence), and its name.
local function top_of(t)
  local top, at = -1, nil
  for name, f in pairs(t) do
    if f > top then top, at = f, name end
  end
  return top, at
end

-- Checks (busted's assert) that every fence in new is above every fence in
-- old (tables of name -> fence): the first fences after an event against
-- all those handed out before it, whatever the primitive or slot (the
-- event takes milliseconds: in one, two slots give the same fence).
-- Without an event between, a name's fences grow (failover.above).
local function above_all(new, old, what)
  local top, at = top_of(old)
  assert.is_true(top > 0, what .. ": no fences before")
  for name, f in pairs(new) do
    assert(f > top, string.format("%s: %s fence %d is not above %s fence %d (%d below)", what, name, f, at, top,
                                  top - f))
  end
end

-- The last fence of srv's record of the slot of the lock on key (nil: none).
local function last_fence(srv, key)
  local raw = srv:raw()
  local _, last = helpers.fence_record(raw, key)
  raw:close()
  return last
end

-- Checks that srv granted the lock's fence in top: its record of the slot
-- of the lock on key holds that fence (no other name take_all uses shares
-- that slot).
local function granted_by(srv, top, key, what)
  assert.are.equal(top.lock, last_fence(srv, key), what .. ": granted elsewhere")
end

-- Checks both: srv granted new's lock fence (granted_by, of the lock on
-- "orders:42"), and new is above every fence of old (above_all).
local function granted_above(srv, new, old, what)
  granted_by(srv, new, "orders:42", what)
  above_all(new, old, what)
end

-- take_all's rounds over client for about seconds: their highest fences.
local function take_for(client, seconds, keys)
  local top, deadline = {}, core.now() + seconds
  repeat
    for name, f in pairs(take_all(client, 1, keys)) do note(top, name, f) end
  until core.now() >= deadline
  return top
end

-- A new folder with "redis.sock" in it, a symbolic link to srv's socket:
-- the one address (as a managed Redis re-points its name). Returns the
-- folder.
local function one_address(srv)
  local dir = helpers.tmpdir()
  assert(os.execute("ln -s " .. helpers.sh_quote(srv.sock) .. " " .. helpers.sh_quote(dir .. "/redis.sock")))
  return dir
end

-- Points the address at srv's socket.
local function point(addr, srv)
  assert(os.execute("ln -sfn " .. helpers.sh_quote(srv.sock) .. " " .. helpers.sh_quote(addr)))
end

-- Starts an empty server that is a replica of a port nobody listens on, so
-- it never syncs, and promotes it.
local function never_synced()
  local srv = helpers.start_redis({ "--replicaof", "127.0.0.1", tostring(helpers.free_port()) })
  assert.matches("^slave", srv:cli("ROLE"))
  assert.are.equal("OK", srv:cli("REPLICAOF", "NO", "ONE"))
  assert.are.equal("0", srv:cli("DBSIZE"))
  return srv
end

-- Stops the servers in list (any of them nil) by PID, and removes dirs.
local function stop_all(servers, dirs)
  for _, s in pairs(servers) do
    if s.pid then signal(s, "CONT") end
    s:stop()
  end
  for _, d in pairs(dirs) do os.execute("rm -rf " .. helpers.sh_quote(d)) end
end

describe("the server behind the one address killed and started again without its data", function()
  local srv, dir, client

  lazy_setup(function()
    srv = helpers.start_redis()
    dir = one_address(srv)
  end)
  lazy_teardown(function()
    if client then client:close() end
    stop_all({ srv }, { dir })
  end)

  it("hands out fences above every fence it handed out before", function()
    client = redislock.new({ path = dir .. "/redis.sock", timeout = 2 })
    local before = take_all(client, 5, ORDERS)
    for i = 1, 2 do
      srv:restart(true)
      assert(helpers.eventually(5, function() return srv:cli("DBSIZE") == "0" end), "not back empty")
      local first = failover.first_round(client, ORDERS)
      granted_above(srv, first, before, "restart " .. i .. ": the first locks")
      before = take_all(client, 3, ORDERS)
      above(before, first, "restart " .. i .. ": the next locks")
    end
  end)
end)

describe("a failover behind the one address, undone", function()
  local master, replica, dir, client

  lazy_setup(function()
    master, replica = helpers.start_with_replica(QUICK_SYNC)
    dir = one_address(master)
  end)
  lazy_teardown(function()
    if client then client:close() end
    stop_all({ master, replica }, { dir })
  end)

  it("gives the old master's first fences above every fence the promoted replica handed out", function()
    local addr = dir .. "/redis.sock"
    client = redislock.new({ path = addr, timeout = 2 })
    local old = take_all(client, 2, ORDERS)
    failover.synced(master, replica)
    failover.cut_off(master, replica)
    for name, f in pairs(take_all(client, 5, ORDERS)) do note(old, name, f) end -- the replica never sees these

    -- The replica is promoted, the address names it, and it grants a while.
    signal(replica, "CONT")
    assert.are.equal("OK", replica:cli("REPLICAOF", "NO", "ONE"))
    master:cli("CLIENT", "KILL", "TYPE", "normal")
    point(addr, replica)
    local promoted = failover.first_round(client, ORDERS)
    granted_above(replica, promoted, old, "the promoted replica's first locks")
    for name, f in pairs(take_for(client, 1.5, ORDERS)) do note(promoted, name, f) end

    -- Undone: the address names the old master again, never demoted, its
    -- data as it was (its records below the replica's fences).
    replica:cli("CLIENT", "KILL", "TYPE", "normal")
    point(addr, master)
    assert.matches("^master", master:cli("ROLE"))
    local back = failover.first_round(client, ORDERS)
    granted_above(master, back, promoted, "the old master's first locks after the promoted replica's")
    above(take_all(client, 2, ORDERS), back, "the old master's next locks")
  end)
end)

describe("a replica promoted before its first sync behind the one address", function()
  local master, fresh, dir, client

  lazy_setup(function()
    master = helpers.start_redis()
    dir = one_address(master)
  end)
  lazy_teardown(function()
    if client then client:close() end
    stop_all({ master, fresh }, { dir })
  end)

  it("hands out fences above every fence of the master it replaced", function()
    local addr = dir .. "/redis.sock"
    client = redislock.new({ path = addr, timeout = 2 })
    local old = take_all(client, 5, ORDERS)
    fresh = never_synced()
    master:cli("CLIENT", "KILL", "TYPE", "normal")
    point(addr, fresh)
    local first = failover.first_round(client, ORDERS)
    granted_above(fresh, first, old, "the promoted replica's first locks")
    above(take_all(client, 2, ORDERS), first, "its next locks")
  end)
end)

describe("the keys fences leave", function()
  local srv, raw, client, other

  helpers.redis_for(function(s, r) srv, raw = s, r end)
  lazy_teardown(function()
    if client then client:close() end
    if other then other:close() end
  end)

  it("are the slot records alone once the holds of thousands of names are gone", function()
    client = srv:client()
    local n, slots, names = 3000, {}, 0
    local function used(name)
      slots[core.lock_slot(name)] = true
      names = names + 1
    end
    for i = 1, n do
      local name = "name" .. i
      local l = assert(client:acquire(name, 5))
      assert(l:release())
      used(name)
      local p = assert(client:semaphore(name, 2):acquire(5))
      assert(p:release())
      local rw = client:rwlock(name)
      local r = assert(rw:read(5))
      assert(r:release())
      local w = assert(rw:write(5))
      assert(w:release())
      local m = assert(client:acquire({ name .. ":a", name .. ":b" }, 5))
      assert(m:release())
      used(name .. ":a")
      used(name .. ":b")
      local lead = assert(client:election(name):campaign("me", 5))
      assert(lead:resign())
      used("election:" .. name)
    end
    -- Some names waited for (a try by another client that fails): their
    -- waiters' marks (the holder's TTL and a second) and the signal lists
    -- the releases push (RL_SIGNAL_MS).
    other = srv:client()
    for i = 1, 200 do
      local name = "busy" .. i
      local l = assert(client:acquire(name, 0.5))
      assert.is_nil(other:acquire(name, 0.5))
      assert(l:release())
      local p = assert(client:semaphore(name, 1):acquire(0.5))
      assert.is_nil(other:semaphore(name, 1):acquire(0.5))
      assert(p:release())
      local w = assert(client:rwlock(name):write(0.5))
      assert.is_nil(other:rwlock(name):read(0.5))
      assert(w:release())
      local lead = assert(client:election(name):campaign("me", 0.5))
      assert.is_nil(other:election(name):campaign("you", 0.5, { wait = 0 }))
      assert(lead:resign())
      used(name)
      used("election:" .. name)
    end
    assert.is_true(raw:command("DBSIZE") > 0 and #raw:command("KEYS", "*:waiters") > 0, "no marks made")
    local want, count = {}, 0
    for slot in pairs(slots) do
      want["lock:{" .. core.era_tag(slot) .. "}:fences"] = true
      count = count + 1
    end
    -- The waiters' marks and signal lists lapse within seconds; DBSIZE
    -- counts an expired key until Redis reclaims it (KEYS leaves it out).
    local left, size
    assert(helpers.eventually(10, function()
      left = {}
      for _, k in ipairs(raw:command("KEYS", "*")) do
        if not want[k] then left[#left + 1] = k end
      end
      size = raw:command("DBSIZE")
      return #left == 0 and size == count
    end), string.format("DBSIZE %d for %d slot records; keys left besides them: %s", size, count,
                        table.concat(left, " ", 1, math.min(#left, 20))))
    local records = #raw:command("KEYS", "*:fences")
    assert.are.equal(count, records)
    assert.is_true(records <= 16384)
    assert.is_true(records < names, string.format("%d records for %d names", records, names))
  end)
end)

describe("one master", function()
  local srv, raw, client

  helpers.redis_for(function(s, r) srv, raw = s, r end)
  lazy_teardown(function() if client then client:close() end end)

  it("hands out growing fences: one name taken again and again, and names of one slot", function()
    client = srv:client()
    local last = 0
    for i = 1, 50 do
      local l = assert(client:acquire("grow", 5))
      assert(l.fence > last, string.format("cycle %d: fence %d after %d", i, l.fence, last))
      last = l.fence
      assert(l:release())
    end
    -- "{grow}:<i>" share a slot, so a record: each grant above the last.
    local slot = core.lock_slot("{grow}:1")
    last = 0
    for i = 1, 50 do
      local name = "{grow}:" .. i
      assert.are.equal(slot, core.lock_slot(name))
      local l = assert(client:acquire(name, 5))
      assert(l.fence > last, string.format("%s: fence %d after %d", name, l.fence, last))
      last = l.fence
      if i % 5 == 0 then assert(l:release()) end -- some held meanwhile
    end
    assert.are.equal(last, select(2, helpers.fence_record(raw, "{grow}:1")))
  end)

  it("honours an earlier version's counters, which go at the name's next grant", function()
    client = client or srv:client()
    local function legacy(key, value)
      assert.are.equal("OK", raw:command("SET", key, value))
    end
    for _, name in ipairs({ "legacy", "legacy:a", "legacy:b", "election:legacy" }) do
      legacy(era_record(name), LEGACY_ERA)
    end
    legacy("lock:{legacy}:fence", "123456")
    legacy("lock:{legacy:a}:fence", "17")
    legacy("lock:{legacy:b}:fence", "123456")
    legacy("lock:{election:legacy}:fence", "123456")
    legacy("lock:{legacy}:permits:fence", "123456")
    legacy("lock:{legacy}:rw:fence", "123456")

    -- A lock: a take (no script), its fence from the slot's own record,
    -- above; the era record stays the earlier version's, and the counter
    -- is left alone until the release deletes it.
    local l = assert(client:acquire("legacy", 5))
    assert.is_true(l.fence > LEGACY_TOP, "fence " .. l.fence)
    assert.are.equal(l.fence, select(2, helpers.fence_record(raw, "legacy")))
    assert.are.equal(LEGACY_ERA, raw:command("GET", era_record("legacy")))
    assert.are.equal("123456", raw:command("GET", "lock:{legacy}:fence"))
    assert(l:release())
    assert.are.equal(0, raw:command("EXISTS", "lock:{legacy}:fence"))
    -- Taken by a script (a waiting acquire's tries after a take that found
    -- the lock held are scripts), its grant overwrites the counter: its
    -- holder's fence, for as long as the lock; gone with it.
    legacy("lock:{legacy}:fence", "123456")
    local holder = assert(client:acquire("legacy", 0.3, { renew = false }))
    local other = srv:client()
    l = assert(other:acquire("legacy", 5, { wait = 3 }))
    assert.is_true(l.fence > holder.fence, "fence " .. l.fence)
    assert.are.equal(l.fence, tonumber(raw:command("GET", "lock:{legacy}:fence")))
    local pttl = raw:command("PTTL", "lock:{legacy}:fence")
    assert.is_true(pttl > 0 and pttl <= 5000, "PTTL " .. pttl)
    assert(l:release())
    other:close()
    assert.are.equal(0, raw:command("EXISTS", "lock:{legacy}:fence"))

    -- Each key of a multi-key lock.
    local m = assert(client:acquire({ "legacy:a", "legacy:b" }, 5))
    for i, key in ipairs({ "lock:{legacy:a}:fence", "lock:{legacy:b}:fence" }) do
      assert.is_true(m.fence[i] > LEGACY_TOP, "fence " .. m.fence[i])
      assert.is_true(raw:command("PTTL", key) > 0, key)
    end
    assert(m:release())
    assert.are.equal(0, raw:command("EXISTS", "lock:{legacy:a}:fence", "lock:{legacy:b}:fence"))

    -- An election's term.
    local lead = assert(client:election("legacy"):campaign("me", 5))
    assert.is_true(lead.term > LEGACY_TOP, "term " .. lead.term)
    assert.is_true(raw:command("PTTL", "lock:{election:legacy}:fence") > 0)
    assert(lead:resign())
    assert.are.equal(0, raw:command("EXISTS", "lock:{election:legacy}:fence"))

    -- A semaphore's and a read-write lock's counters go at their next grant.
    local p = assert(client:semaphore("legacy", 2):acquire(5))
    assert.is_true(p.fence > LEGACY_TOP, "fence " .. p.fence)
    assert.are.equal(0, raw:command("EXISTS", "lock:{legacy}:permits:fence"))
    assert(p:release())
    local r = assert(client:rwlock("legacy"):read(5))
    assert.is_true(r.fence > LEGACY_TOP, "fence " .. r.fence)
    assert.are.equal(0, raw:command("EXISTS", "lock:{legacy}:rw:fence"))
    assert(r:release())
    legacy("lock:{legacy}:rw:fence", "123456")
    local w = assert(client:rwlock("legacy"):write(5))
    assert.is_true(w.fence > LEGACY_TOP, "fence " .. w.fence)
    assert.are.equal(0, raw:command("EXISTS", "lock:{legacy}:rw:fence"))
    assert(w:release())

    -- The record a stream now, a lock is a take's (no script): its fence
    -- is above the counter, which it leaves alone; a lock that expires
    -- leaves it too, and the name's next release deletes it.
    legacy("lock:{legacy}:fence", "123456")
    l = assert(client:acquire("legacy", 0.2, { renew = false }))
    assert.is_true(l.fence > LEGACY_TOP)
    assert.are.equal("123456", raw:command("GET", "lock:{legacy}:fence"))
    assert(helpers.eventually(3, function() return raw:command("EXISTS", "lock:{legacy}") == 0 end),
           "the lock never expired")
    assert.are.equal(1, raw:command("EXISTS", "lock:{legacy}:fence"))
    l = assert(client:acquire("legacy", 5))
    assert.is_true(l.fence > LEGACY_TOP)
    assert(l:release())
    assert.are.equal(0, raw:command("EXISTS", "lock:{legacy}", "lock:{legacy}:fence"))
  end)
end)

-- The same under OpenResty (the cosocket transport), in a real nginx (2
-- workers) whose server blocks name each topology: "restart", "one" and
-- "early" a unix socket path (the one address), "direct" a server's port.
-- The handlers are spec/support/ngx_app.lua's: /fences (a lock, a fresh
-- key, a semaphore's permit, a writer, a multi-key lock), /election (a
-- campaign and a resign), /acquire and /release. LuaJIT pass only (nginx
-- loads that build).
describe("under OpenResty", function()
  if helpers.no_nginx(pending) then return end

  local lost, master, replica, early, fresh, direct, raw, nginx
  local dirs = {}

  lazy_setup(function()
    lost = helpers.start_redis()
    dirs.lost = one_address(lost)
    master, replica = helpers.start_with_replica(QUICK_SYNC)
    dirs.one = one_address(master)
    early = helpers.start_redis()
    dirs.early = one_address(early)
    direct = helpers.start_redis()
    raw = direct:raw()
    local function server(name, url)
      return { name = name, string.format('set $redis_url "%s";', url), 'set $redis_timeout "1";',
               helpers.location("/fences", "fences"), helpers.location("/election", "election"),
               helpers.location("/acquire", "acquire"), helpers.location("/release", "release") }
    end
    nginx = helpers.start_nginx({
      workers = 2,
      http = "lua_socket_log_errors off;",
      servers = {
        server("restart", "unix://" .. dirs.lost .. "/redis.sock"),
        server("one", "unix://" .. dirs.one .. "/redis.sock"),
        server("early", "unix://" .. dirs.early .. "/redis.sock"),
        server("direct", "redis://127.0.0.1:" .. direct.port),
      },
    })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
    if raw then raw:close() end
    stop_all({ lost, master, replica, early, fresh, direct }, dirs)
  end)

  -- A request to the server named host -> its body, or nil and the status
  -- and body.
  local function get(host, path)
    local status, body = http.request(nginx.port, "GET", path, { headers = { Host = host } })
    if status ~= 200 then return nil, status .. " " .. tostring(body) end
    return body
  end

  -- The highest fences of rounds requests to /fences and /election on the
  -- server named host (names from key), or nil and the first failure.
  local function fences(host, key, rounds)
    local top = {}
    for _ = 1, rounds or 1 do
      local body, err = get(host, "/fences?key=" .. key .. "&fresh=" .. key .. ":fresh")
      if not body then return nil, err end
      for name, f in pairs(failover.parse(body)) do note(top, name, f) end
      body, err = get(host, "/election?name=" .. key .. ":jobs")
      if not body then return nil, err end
      note(top, "term", tonumber(body:match("^(%d+) ")))
    end
    return top
  end

  -- fences(), tried again for up to 20 s (while the address settles: each
  -- worker may hold connections to the server it named before).
  local function first_fences(host, key)
    local got, last
    helpers.eventually(20, function()
      got, last = fences(host, key)
      return got
    end)
    return assert(got, "no fences from " .. host .. ": " .. tostring(last) .. "\n" .. nginx:error_log())
  end

  -- fences() for about seconds: their highest.
  local function fences_for(host, key, seconds)
    local top, deadline = {}, core.now() + seconds
    repeat
      for name, f in pairs(assert(fences(host, key))) do note(top, name, f) end
    until core.now() >= deadline
    return top
  end

  it("after the server behind the one address started again empty: fences above every earlier one", function()
    local before = assert(fences("restart", "orders:42", 5))
    for i = 1, 2 do
      lost:restart(true)
      assert(helpers.eventually(5, function() return lost:cli("DBSIZE") == "0" end), "not back empty")
      local first = first_fences("restart", "orders:42")
      granted_above(lost, first, before, "restart " .. i .. ": the first locks")
      before = assert(fences("restart", "orders:42", 3))
      above(before, first, "restart " .. i .. ": the next locks")
    end
  end)

  it("after a failover behind the one address is undone: the old master's fences above the replica's", function()
    local old = assert(fences("one", "orders:42", 2))
    failover.synced(master, replica)
    failover.cut_off(master, replica)
    for name, f in pairs(assert(fences("one", "orders:42", 5))) do note(old, name, f) end
    signal(replica, "CONT")
    assert.are.equal("OK", replica:cli("REPLICAOF", "NO", "ONE"))
    master:cli("CLIENT", "KILL", "TYPE", "normal")
    point(dirs.one .. "/redis.sock", replica)
    local promoted = first_fences("one", "orders:42")
    granted_above(replica, promoted, old, "the promoted replica's first locks")
    for name, f in pairs(fences_for("one", "orders:42", 1.5)) do note(promoted, name, f) end
    replica:cli("CLIENT", "KILL", "TYPE", "normal")
    point(dirs.one .. "/redis.sock", master)
    assert.matches("^master", master:cli("ROLE"))
    local back = first_fences("one", "orders:42")
    granted_above(master, back, promoted, "the old master's first locks after the promoted replica's")
    -- A request on each worker (2 workers: four requests reach both, most likely).
    for _ = 1, 4 do
      granted_above(master, assert(fences("one", "orders:42")), promoted, "the old master's next locks")
    end
  end)

  it("after a replica promoted before its first sync: fences above the master's", function()
    local old = assert(fences("early", "orders:42", 5))
    fresh = never_synced()
    early:cli("CLIENT", "KILL", "TYPE", "normal")
    point(dirs.early .. "/redis.sock", fresh)
    local first = first_fences("early", "orders:42")
    granted_above(fresh, first, old, "the promoted replica's first locks")
    for _ = 1, 4 do
      granted_above(fresh, assert(fences("early", "orders:42")), old, "its next locks")
    end
  end)

  it("hands out growing fences: one name taken again and again, and names of one slot", function()
    local last = 0
    for _, name in ipairs({ "grow", "{grow}:" }) do
      last = 0
      for i = 1, 50 do
        local key = name == "grow" and name or name .. i
        local body = assert(get("direct", "/acquire?key=" .. key .. "&ttl=5"))
        local fence, token = body:match("^(%d+) (%S+)")
        fence = tonumber(fence)
        assert(fence > last, string.format("%s: fence %d after %d", key, fence, last))
        last = fence
        assert(get("direct", "/release?key=" .. key .. "&token=" .. token))
      end
    end
    assert.are.equal(last, select(2, helpers.fence_record(raw, "{grow}:1")))
  end)

  it("honours an earlier version's counters, which go at the name's next grant", function()
    local function legacy(key, value)
      assert.are.equal("OK", raw:command("SET", key, value))
    end
    for _, name in ipairs({ "legacy", "old", "old:pool", "old:doc", "old:a", "old:b", "election:old:jobs" }) do
      legacy(era_record(name), LEGACY_ERA)
    end
    legacy("lock:{legacy}:fence", "123456")
    -- A take: its fence above; the counter left alone until the release.
    local body = assert(get("direct", "/acquire?key=legacy&ttl=5"))
    local fence, token = body:match("^(%d+) (%S+)")
    assert.is_true(tonumber(fence) > LEGACY_TOP, "fence " .. fence)
    assert.are.equal(tonumber(fence), select(2, helpers.fence_record(raw, "legacy")))
    assert.are.equal("123456", raw:command("GET", "lock:{legacy}:fence"))
    assert(get("direct", "/release?key=legacy&token=" .. token))
    assert.are.equal(0, raw:command("EXISTS", "lock:{legacy}:fence"))
    assert.are.equal(LEGACY_ERA, raw:command("GET", era_record("legacy")))

    local counters = { "lock:{old}:fence", "lock:{old:pool}:permits:fence", "lock:{old:doc}:rw:fence",
                       "lock:{old:a}:fence", "lock:{old:b}:fence", "lock:{election:old:jobs}:fence" }
    for _, key in ipairs(counters) do legacy(key, "123456") end
    local top = assert(fences("direct", "old"))
    for name, f in pairs(top) do
      assert.is_true(f > LEGACY_TOP, name .. " fence " .. f)
    end
    assert.are.equal(0, raw:command("EXISTS", unpack(counters)))
  end)
end)
