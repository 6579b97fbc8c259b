-- SPDX-License-Identifier: MIT
-- Guarded writes (redislock/guard.lua): hold:fenced([client]) applies a
-- write only when the hold's fence is at least the highest the resource
-- accepted; hold:owned() only while the hold is still ours. A holder that
-- is paused past its TTL (a real process, SIGSTOP) and writes after its
-- successor is refused, for each form: the lock's server, another server,
-- a cluster, owner-checked. Then each write, the holds that guard, and bad
-- input. Real servers on loopback, each topology started once.
local redislock = require("redislock")
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")

local paused_holder = require("spec.support.paused").holder

describe("guarded writes on one server", function()
  local srv, other, raw, client, data

  lazy_setup(function()
    srv = helpers.start_redis()
    other = helpers.start_redis()
    raw = srv:raw()
    client = srv:client()
    data = other:client()
  end)
  lazy_teardown(function()
    if client then client:close() end
    if data then data:close() end
    if raw then raw:close() end
    if srv then srv:stop() end
    if other then other:stop() end
  end)

  it("refuse a paused holder's write after its successor's, on the lock's server (fenced)", function()
    local out = paused_holder(tostring(srv.port), "g:same", "fenced", nil, "doc:same", function()
      local lock = assert(client:acquire("g:same", 5))
      assert.are.same({ true, 1 }, { lock:fenced():set("doc:same", "new") })
      assert(lock:release())
    end)
    assert.matches('refused stale: "doc:same" accepted fence %d+ already; this lock\'s is %d+', out)
    assert.are.equal("new", raw:command("GET", "doc:same"))
  end)

  it("refuse a paused holder's write after its successor's, on another server (fenced)", function()
    local out = paused_holder(tostring(srv.port), "g:other", "fenced-other", tostring(other.port), "doc:other",
                              function()
      local lock = assert(client:acquire("g:other", 5))
      assert.is_true((lock:fenced(data):set("doc:other", "new")))
      assert(lock:release())
    end)
    assert.matches("refused stale: ", out)
    assert.are.equal("new", other:cli("GET", "doc:other"))
  end)

  it("refuse a paused holder's write once its lock is another's (owned), and it reports lost", function()
    local out = paused_holder(tostring(srv.port), "g:owned", "owned", nil, "{g:owned}:doc", function()
      local lock = assert(client:acquire("g:owned", 5))
      assert.is_true((lock:owned():set("{g:owned}:doc", "new")))
      -- The successor still holds it when the old holder writes.
    end)
    assert.matches('refused lost: "g:owned" is no longer ours %(found by an owner%-checked write%)', out)
    assert.are.equal("new", raw:command("GET", "{g:owned}:doc"))
    assert.are.equal(1, raw:command("DEL", "lock:{g:owned}"))
    -- Owned, in this process: a lock found lost reports it.
    local lock = assert(client:acquire("g:owned", 5))
    assert.are.equal(1, raw:command("DEL", "lock:{g:owned}"))
    local ok, err = lock:owned():incr("{g:owned}:n")
    assert.is_false(ok)
    assert.matches("^lost: ", err)
    assert.are.equal(0, raw:command("EXISTS", "{g:owned}:n"))
    local held, why = lock:check()
    assert.is_nil(held)
    assert.are.equal(err, why)
  end)

  it("refuse an older fence than the resource's highest when nobody holds a lock any more", function()
    local old = assert(client:acquire("g:late", 0.2, { renew = false }))
    core.sleep(0.3) -- expired, not released: by its own account still held
    local new = assert(client:acquire("g:late", 5))
    assert.is_true(new.fence > old.fence)
    assert.is_true((new:fenced():set("doc:late", "new")))
    assert(new:release())
    assert.are.equal("", srv:cli("GET", "lock:{g:late}"))
    local ok, err = old:fenced():set("doc:late", "old")
    assert.is_false(ok)
    assert.are.equal(string.format('stale: "doc:late" accepted fence %d already; this lock\'s is %d',
                                   new.fence, old.fence), err)
    assert.are.equal("new", raw:command("GET", "doc:late"))
    assert.are.equal(tostring(new.fence), raw:command("GET", "{doc:late}:fence"))
  end)

  it("apply each write and answer its reply; equal fences write again", function()
    local lock = assert(client:acquire("g:writes", 5))
    local g = lock:fenced()
    assert.are.same({ true, 1 }, { g:set("w:s", "v", 10) })
    local ttl = raw:command("PTTL", "w:s")
    assert.is_true(ttl > 9000 and ttl <= 10000, tostring(ttl))
    assert.are.same({ true, 2 }, { g:hset("w:h", "a", "1", "b", 2) })
    assert.are.same({ "1", "2" }, raw:command("HMGET", "w:h", "a", "b"))
    assert.are.same({ true, 1 }, { g:incr("w:n") })
    assert.are.same({ true, 11 }, { g:incr("w:n", 10) })
    assert.are.same({ true, 2 }, { g:rpush("w:l", "x", "y") })
    assert.are.same({ true, 1 }, { g:del("w:s") })
    assert.are.same({ true, "v:x" },
                    { g:eval("return ARGV[1] .. ':' .. redis.call('LPOP', KEYS[1])", { "w:l" }, { "v" }) })
    assert.are.same({ true, nil }, { g:eval("redis.call('SET', KEYS[1], ARGV[1])", { "w:e" }, { 5 }) })
    assert.are.equal("5", raw:command("GET", "w:e"))
    -- A write the server refuses leaves the fence record as it was.
    assert.are.equal("OK", raw:command("SET", "w:t", "text"))
    local _, err = g:rpush("w:t", "x")
    assert.matches("^redis: .*WRONGTYPE", err)
    assert.are.equal(0, raw:command("EXISTS", "{w:t}:fence"))
    -- A script that fails part-way: what it wrote stays guarded by its fence.
    _, err = g:eval("redis.call('SET', KEYS[1], 'half') error('boom')", { "w:half" })
    assert.matches("boom", err)
    assert.are.equal("half", raw:command("GET", "w:half"))
    assert.are.equal(tostring(lock.fence), raw:command("GET", "{w:half}:fence"))
    local older = client:from_token("g:writes", lock.token)
    older.fence = lock.fence - 1
    assert.is_false((older:fenced():set("w:half", "stale")))
    assert.are.equal("half", raw:command("GET", "w:half"))
    -- Owned: the same writes while the lock is ours.
    local o = lock:owned()
    assert.are.same({ true, 12 }, { o:incr("w:n") })
    assert.are.same({ true, "12" }, { o:eval("return redis.call('GET', KEYS[1])", { "w:n" }) })
    assert(lock:release())
  end)

  it("guard with a semaphore's permit and a write lock; a read lock is not an owner", function()
    local permit = assert(client:semaphore("g:pool", 2):acquire(5))
    assert.is_true((permit:fenced():set("p:doc", "1")))
    assert.is_true((permit:owned():set("{g:pool}:doc", "1")))
    assert(permit:release())
    local ok, err = permit:owned():set("{g:pool}:doc", "2")
    assert.is_false(ok)
    assert.matches("^lost: a permit of semaphore \"g:pool\" was already released", err)
    local writer = assert(client:rwlock("g:doc"):write(5))
    assert.is_true((writer:fenced():set("rw:doc", "1")))
    assert.is_true((writer:owned():set("{g:doc}:x", "1")))
    assert(writer:release())
    local reader = assert(client:rwlock("g:doc"):read(5))
    assert.has_error(function() reader:owned() end,
                     "bad self to 'owned' (a read lock does not own writes; owner-checked writes go with a lock, a "
                     .. "write lock, a permit or a leadership)")
    assert(reader:release())
  end)

  it("refuse bad input with a clear error, and never write unguarded", function()
    local lock = assert(client:acquire("g:bad", 5))
    local g = lock:fenced()
    assert.has_error(function() lock.fenced(nil) end,
                     "bad self to 'fenced' (redislock lock expected, got nil; call it with ':', as x:fenced(...))")
    assert.has_error(function() lock:fenced({}) end,
                     "bad argument #1 to 'fenced' (client must be a redislock client, got table)")
    assert.has_error(function() g:set("", "v") end,
                     "bad argument #1 to 'set' (key must be a non-empty string, got \"\")")
    assert.has_error(function() g:set("k", {}) end)
    assert.has_error(function() g:set("k", "v", 0) end)
    assert.has_error(function() g:hset("k", "f") end)
    assert.has_error(function() g:incr("k", 1.5) end)
    assert.has_error(function() g:eval("return 1", {}) end)
    assert.has_error(function() g:set("a}b", "v") end,
                     "bad argument #1 to 'set' (\"a}b\" has a '}' but no hash tag: its fence record cannot share its "
                     .. "slot; give it a hash tag ({...}))")
    assert.has_error(function() g.set(lock, "k", "v") end)
    assert(lock:release())
    local ok, err = g:set("k:bad", "v")
    assert.is_false(ok)
    assert.are.equal('lost: "g:bad" was already released', err)
    assert.are.equal(0, raw:command("EXISTS", "k:bad"))
  end)

  it("give a script's error as nil and a redis: error, with the script's own line numbers", function()
    local lock = assert(client:acquire("gw:err", 10))
    for _, g in ipairs({ lock:fenced(), lock:owned() }) do
      local key = g.owned and "lock:{gw:err}:data" or "gw:err:data"
      local ok, err = g:eval("return redis.error_reply('boom')", { key })
      assert.is_nil(ok)
      assert.are.equal("redis: ERR boom", err)
      ok, err = g:eval("local x = 1\nreturn redis.call('NOPE')", { key })
      assert.is_nil(ok)
      assert.matches("^redis: ERR Unknown Redis command called from script script: %x+, on @user_script:2%.$", err)
      ok, err = g:eval("error('bad')", { key })
      assert.is_nil(ok)
      assert.matches("user_script:1: bad ", err)
      -- an error inside the reply is the reply's, not the call's
      local reply
      ok, reply = g:eval("return {1, redis.error_reply('inner')}", { key })
      assert.is_true(ok)
      assert.are.equal(1, reply[1])
    end
    assert(lock:release())
  end)

  it("say plainly, at the caller's line, why a guard cannot be made or used", function()
    local lock = assert(client:acquire("gw:bad", 10))
    local closed = srv:client()
    local g = lock:fenced(closed)
    closed:close()
    local ok, err = pcall(function() local r = g:set("gw:bad:data", "v") return r end)
    assert.is_false(ok)
    assert.matches("33%-guarded_writes_spec%.lua:%d+: bad self to 'set' %(the guard's client is closed%)$", err)
    ok, err = pcall(function() local r = lock:fenced(closed) return r end)
    assert.is_false(ok)
    assert.matches("33%-guarded_writes_spec%.lua:%d+: bad argument #1 to 'fenced' %(client is closed%)$", err)
    local multi = assert(client:acquire({ "gw:m1", "gw:m2" }, 10))
    for _, fname in ipairs({ "fenced", "owned" }) do
      ok, err = pcall(function() local r = multi[fname](multi) return r end)
      assert.is_false(ok)
      assert.matches("33%-guarded_writes_spec%.lua:%d+: bad self to '" .. fname .. "' %(a multi%-key lock has a "
                     .. "fence per key %(fence%[i%]%) and guards no writes", err)
    end
    assert(multi:release())
    local adopted = client:from_token("gw:bad", lock.token)
    ok, err = pcall(function() local r = adopted:fenced() return r end)
    assert.is_false(ok)
    assert.matches("bad self to 'fenced' %(a hold with one fence expected; a lock made by from_token has none", err)
    assert.is_true((adopted:owned():set("lock:{gw:bad}:note", "n"))) -- the owner check needs no fence
    assert(lock:release())
  end)

  it("keep each fence record in its key's hash slot", function()
    local guard = require("redislock.guard")
    for _, k in ipairs({ "doc", "user:{42}:doc", "a{b", "a{b}c{d}", "{x}" }) do
      local f = guard.fence_key(k)
      assert.are.equal(core.slot(k), core.slot(f), k .. " -> " .. f)
    end
    for _, k in ipairs({ "a}b", "{}x", "x{}" }) do assert.is_nil(guard.fence_key(k), k) end
  end)
end)

describe("guarded writes in a Redis Cluster", function()
  local cl, client

  lazy_setup(function()
    cl = helpers.start_cluster({ masters = 3, replicas = 0 })
    client = redislock.new({ cluster = cl.seeds })
  end)
  lazy_teardown(function()
    if client then client:close() end
    if cl then cl:stop() end
  end)

  it("refuse a paused holder's write after its successor's (fenced and owned)", function()
    local where = "cluster:" .. table.concat(cl.seeds, ",")
    local out = paused_holder(where, "g:c", "fenced", nil, "c:doc", function()
      local lock = assert(client:acquire("g:c", 5))
      assert.is_true((lock:fenced():set("c:doc", "new")))
      assert(lock:release())
    end)
    assert.matches("refused stale: ", out)
    assert.are.equal("new", cl:owner(core.slot("c:doc")):cli("GET", "c:doc"))
    out = paused_holder(where, "g:co", "owned", nil, "{g:co}:doc", function()
      local lock = assert(client:acquire("g:co", 5))
      assert.is_true((lock:owned():set("{g:co}:doc", "new")))
    end)
    assert.matches("refused lost: ", out)
  end)

  it("refuse keys that the script's node does not hold", function()
    local lock = assert(client:acquire("g:slots", 5))
    assert.has_error(function() lock:owned():set("elsewhere", "v") end)
    local ok, err = pcall(lock.owned(lock).set, lock:owned(), "elsewhere", "v")
    assert.is_false(ok)
    assert.matches("\"elsewhere\" is in hash slot %d+, not %d+ %(the lock's%): give it the same hash tag", err)
    assert.has_error(function() lock:fenced():del("a", "b") end)
    assert.is_true((lock:fenced():del("{t}a", "{t}b")))
    assert(lock:release())
  end)
end)

describe("guarded writes with a Redlock lock", function()
  local servers, data, client, store

  lazy_setup(function()
    local urls
    servers, urls = helpers.start_redlock(3)
    local list = {}
    for u in urls:gmatch("[^,]+") do list[#list + 1] = u end
    client = redislock.new({ redlock = list })
    data = helpers.start_redis()
    store = data:client()
  end)
  lazy_teardown(function()
    if client then client:close() end
    if store then store:close() end
    if data then data:stop() end
    for _, s in ipairs(servers or {}) do s:stop() end
  end)

  it("fence writes to the resource's own server, and say why not to Redlock's", function()
    -- Each server has a tenth of the TTL to answer: 100 ms, which a loaded
    -- machine meets (20 ms it did not).
    local old = assert(client:acquire("g:rl", 1, { renew = false }))
    core.sleep(1.1)
    local new = assert(client:acquire("g:rl", 5))
    assert.is_true((new:fenced(store):set("rl:doc", "new")))
    local ok, err = old:fenced(store):set("rl:doc", "old")
    assert.is_false(ok)
    assert.matches("^stale: ", err)
    assert.are.equal("new", data:cli("GET", "rl:doc"))
    assert.has_error(function() new:fenced() end)
    assert.has_error(function() new:owned() end)
    assert.has_error(function() new:fenced(client) end)
    assert(new:release())
  end)
end)

describe("guarded writes under OpenResty", function()
  if helpers.no_nginx(pending) then return end

  local srv, other, cl, client, data, cluster, nginx

  lazy_setup(function()
    srv, other = helpers.start_redis(), helpers.start_redis()
    cl = helpers.start_cluster({ masters = 3, replicas = 0 })
    client, data = srv:client(), other:client()
    cluster = redislock.new({ cluster = cl.seeds })
    nginx = helpers.start_nginx({
      workers = 1,
      server = {
        helpers.redis_vars(srv),
        helpers.location("/guarded", "guarded"),
        helpers.location("/cluster/guarded", "guarded", 'set $redis_cluster "' .. table.concat(cl.seeds, ",") .. '";'),
      },
    })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
    for _, c in ipairs({ client, data, cluster }) do c:close() end
    if cl then cl:stop() end
    if srv then srv:stop() end
    if other then other:stop() end
  end)

  -- name, the path, the form, the resource's port (fenced to another
  -- server), the client of the lock (and of the worker's marks) and of the
  -- resource.
  local cases = {
    { "fenced, the lock's server", "/guarded", "fenced", nil, function() return client, client end },
    { "owned", "/guarded", "owned", nil, function() return client, client end },
    { "fenced, another server", "/guarded", "fenced", function() return other.port end,
      function() return client, data end },
    { "fenced, a cluster", "/cluster/guarded", "fenced", nil, function() return cluster, cluster end },
    { "owned, a cluster", "/cluster/guarded", "owned", nil, function() return cluster, cluster end },
  }
  for i, case in ipairs(cases) do
    local name, path, form, rport, clients = case[1], case[2], case[3], case[4], case[5]
    it("refuse a paused worker's write after its successor's (" .. name .. ")", function()
      local locks, store = clients()
      local key = "g:ngx:" .. i
      local rkey = "{" .. key .. "}:doc"
      local request = http.start(nginx.port, "GET", path .. "?key=" .. key .. "&ttl=0.5&form=" .. form .. "&rkey="
                                 .. rkey .. (rport and "&rport=" .. rport() or ""), { timeout = 30 })
      local pid
      assert(helpers.eventually(5, function()
        pid = locks:command("GET", rkey .. ":pid")
        return pid
      end), "the request never held the lock")
      assert(os.execute("kill -STOP " .. pid))
      local ok, err = pcall(function()
        core.sleep(0.7) -- past its TTL
        local lock = assert(locks:acquire(key, 5))
        local guard = form == "owned" and lock:owned() or lock:fenced(store)
        assert.is_true((guard:set(rkey, "new")))
      end)
      assert(os.execute("kill -CONT " .. pid))
      assert(ok, err)
      assert.are.equal("OK", locks:command("SET", rkey .. ":go", "1"))
      local status, body = request:finish()
      assert.are.equal(200, status, body)
      assert.matches(form == "owned" and "^refused lost: " or "^refused stale: ", body)
      assert.are.equal("new", store:command("GET", rkey))
    end)
  end
end)
