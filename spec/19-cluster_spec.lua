-- SPDX-License-Identifier: MIT
-- run.sh: long 170 (its seconds on a loaded 2-core machine: spec/run.sh starts it early; make check skips it)
-- Redis Cluster: the slot function and redirect parsing of the C core, then
-- a real cluster on loopback (3 masters, 3 replicas; spec/helpers.lua),
-- started once for this file. Locks reach the master that owns their slot;
-- a slot moved (MOVED), half moved (ASK, TRYAGAIN) or moving while a lock is
-- held or waited for keeps every lock where it belongs.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")
local redislock = require("redislock")

describe("cluster slots (C core)", function()
  it("computes the slots of the cluster specification", function()
    assert.are.equal(12739, core.slot("123456789"))
    -- Hash tags: the first {...} that is not empty; else the whole name.
    assert.are.equal(core.slot("user1000"), core.slot("{user1000}.following"))
    assert.are.equal(core.slot("user1000"), core.slot("foo{user1000}{bar}"))
    assert.are.equal(core.slot("foo{}{bar}"), core.slot("foo{}{bar}"))
    assert.are_not.equal(core.slot("bar"), core.slot("foo{}{bar}"))
    assert.are.equal(core.slot("{bar"), core.slot("foo{{bar}}zap"))
    assert.are.equal(core.slot("foo{bar"), core.slot("foo{bar"))
    assert.are.equal(core.slot(""), 0)
    -- A lock's slot is that of all its names.
    for _, key in ipairs({ "orders:42", "a}b", "x{y}z", "{", "héllo" }) do
      assert.are.equal(core.slot("lock:{" .. key .. "}"), core.lock_slot(key))
      assert.are.equal(core.slot("lock:{" .. key .. "}:fence"), core.lock_slot(key))
    end
    assert.has_error(function() core.lock_slot("") end)
    assert.has_error(function() core.lock_slot("}x") end)
  end)

  it("parses MOVED and ASK", function()
    assert.are.same({ "MOVED", 3999, "127.0.0.1", 6381 }, { core.redirect("MOVED 3999 127.0.0.1:6381") })
    assert.are.same({ "ASK", 1, "::1", 7000 }, { core.redirect("redis: ASK 1 ::1:7000") })
    assert.are.same({ "MOVED", 12, "", 7000 }, { core.redirect("MOVED 12 :7000") })
    assert.are.same({ "MOVED", 16383, "redis-3.example", 6379 }, { core.redirect("MOVED 16383 redis-3.example:6379") })
    for _, bad in ipairs({ "MOVED 16384 a:1", "MOVED -1 a:1", "MOVED 1 a", "MOVED 1 a:0", "MOVED 1 a:65536",
                           "MOVED x a:1", "ASK 1 a:1 more", "MOVEDX 1 a:1", "ERR MOVED 1 a:1", "TRYAGAIN", "" }) do
      assert.is_nil(core.redirect(bad), bad)
    end
  end)
end)

describe("Redis Cluster", function()
  local cl, c

  lazy_setup(function() cl = helpers.start_cluster() end)
  lazy_teardown(function() if cl then cl:stop() end end)

  local function client(extra)
    local o = { cluster = { cl.seeds[1], cl.seeds[2] } }
    for k, v in pairs(extra or {}) do o[k] = v end
    return redislock.new(o)
  end

  -- Each test's client (a test that needs more makes them).
  before_each(function() c = client() end)
  after_each(function() c:close() end)

  it("agrees with the cluster on every slot (CLUSTER KEYSLOT)", function()
    local n = cl.nodes[1]
    for _, name in ipairs({ "123456789", "lock:{orders:42}", "foo{}{bar}", "foo{{bar}}zap", "a{b}c{d}", "{}", "x" }) do
      assert.are.equal(tonumber(n:cli("CLUSTER", "KEYSLOT", name)), core.slot(name), name)
    end
  end)

  it("runs semaphores, read-write locks and multi-key locks (keys on several masters, taken one by one)", function()
    local sem = c:semaphore("c:pool", 2)
    local p1, p2 = assert(sem:acquire(5)), assert(sem:acquire(5))
    assert.is_nil(sem:acquire(5))
    assert.are.equal(2, sem:count())
    assert.are.equal(2, tonumber(cl:owner(core.lock_slot("c:pool")):cli("ZCARD", "lock:{c:pool}:permits")))
    assert(p1:release()); assert(p2:release())
    local rw = c:rwlock("c:doc")
    local r = assert(rw:read(5))
    assert.is_nil(rw:write(5))
    assert(r:release())
    assert(assert(rw:write(5)):release())
    -- Keys whose slots are on every master.
    local keys, masters = {}, {}
    for i = 1, 40 do
      local key = "c:multi:" .. i
      local owner = cl:owner(core.lock_slot(key))
      if not masters[owner.port] then masters[owner.port] = true; keys[#keys + 1] = key end
    end
    assert.are.equal(3, #keys)
    local lock = assert(c:acquire(keys, 5))
    for _, key in ipairs(keys) do
      assert.are.equal(lock.token, (cl:lock_at_owner(key)))
    end
    local single, err = c:acquire(keys[2], 5)
    assert.is_nil(single)
    assert.matches("^busy:", err)
    assert.is_nil(c:acquire({ keys[3], "c:multi:free" }, 5))
    assert.are.equal("", (cl:lock_at_owner("c:multi:free")))
    assert(lock:release())
    for _, key in ipairs(keys) do
      assert.are.equal("", (cl:lock_at_owner(key)))
    end
    -- Processes naming the keys in opposite orders: no deadlock, no overlap.
    local where = "cluster:" .. table.concat(cl.seeds, ",")
    local list = table.concat(keys, ",")
    local reversed = table.concat({ keys[3], keys[2], keys[1] }, ",")
    local start_at = core.now() + 0.5 * helpers.slow
    local procs = {}
    for i = 1, 4 do
      procs[i] = helpers.spawn_primitive(where, "multi", start_at, i % 2 == 0 and list or reversed, 10)
    end
    assert.are.equal(0, helpers.overlaps(procs))
  end)

  it("takes locks on every master, each at its slot's owner without a redirect once the table is loaded", function()
    assert(assert(c:acquire("warm", 5)):release())
    local moved = cl:redirects()
    assert.are.equal(3, cl:spread(c, "spread:", 60))
    -- Names with braces of their own: the tag runs from redislock's '{' to
    -- the name's first '}', so names that agree up to it share a slot.
    local a = assert(c:acquire("{user:7}:a", 5))
    local b = assert(c:acquire("{user:7}:b", 5))
    assert.are.equal(core.lock_slot("{user:7}:a"), core.lock_slot("{user:7}:b"))
    assert.are.equal(core.slot("{user:7"), core.lock_slot("{user:7}:b"))
    local owner = cl:owner(core.lock_slot("{user:7}:a"))
    assert.are.equal(tonumber(owner:cli("CLUSTER", "KEYSLOT", "lock:{{user:7}:a}")), core.lock_slot("{user:7}:a"))
    assert.are.equal(a.token, owner:cli("GET", "lock:{{user:7}:a}"))
    assert.are.equal(b.token, owner:cli("GET", "lock:{{user:7}:b}"))
    assert(a:release() and b:release())
    assert.are.equal(moved, (cl:redirects()))
    assert.matches("cluster of 2 seeds", tostring(c))
  end)

  it("starts from any seed that answers", function()
    local dead = "127.0.0.1:" .. helpers.free_port()
    local seeded = redislock.new({ cluster = { dead, cl.seeds[3] } })
    assert(assert(seeded:acquire("seed", 5)):release())
    seeded:close()
    seeded = redislock.new({ cluster = { dead } })
    helpers.acquire_fails(seeded, "seed", "^connection: no cluster node reachable %(connection: cannot connect to "
                          .. dead:gsub("%.", "%%."))
    seeded:close()
  end)

  it("follows MOVED after a slot moved, keeping its fence growing", function()
    local key = "moved"
    local slot = core.lock_slot(key)
    local first = assert(c:acquire(key, 5))
    assert.is_true(first:release())
    local from, to = cl:move(slot)
    assert.are_not.equal(from, to)
    local moved = cl:redirects()
    local lock = assert(c:acquire(key, 5))
    assert.are.equal(lock.token, to:cli("GET", "lock:{moved}"))
    assert.is_true(lock.fence > first.fence)
    -- One redirected take: its SET and its XADD each answer MOVED (EXEC
    -- then refuses the transaction), once; the take then goes again to the
    -- new owner, where it took the lock alone (a take keeps no holder's
    -- fence key) with a fence of the slot's record there.
    local now_moved = cl:redirects()
    assert.are.equal(moved + 2, now_moved)
    assert.are.equal("0", to:cli("EXISTS", "lock:{moved}:fence"))
    local t = to:raw()
    assert.are.equal(lock.fence, select(2, helpers.fence_record(t, key)))
    t:close()
    assert.is_true(lock:release())
  end)

  it("releases and extends through ASK while the slot moves, and loads the script on the target first", function()
    local key = "asking"
    local lock = assert(c:acquire(key, 5))
    local slot, from, to = cl:where(key)
    assert.are.equal("OK", to:cli("SCRIPT", "FLUSH")) -- EVALSHA there answers NOSCRIPT
    cl:begin_move(slot, from, to)
    finally(function() cl:end_move(slot, from, to) end)
    cl:move_keys(slot, from, to)
    -- Another client's take meets ASK at the source; after ASKING it goes
    -- to the target as the acquire script (a transaction after ASKING is
    -- refused whole), never as a transaction, and the lock is busy.
    local function multis()
      return tonumber(to:cli("INFO", "commandstats"):match("cmdstat_multi:calls=(%d+)") or "0")
    end
    local _, asked = cl:redirects()
    local m0, other = multis(), client()
    local none, err = other:acquire(key, 5)
    other:close()
    assert.is_nil(none)
    assert.matches("^busy: ", err)
    assert.are.equal(m0, multis())
    local _, asked_busy = cl:redirects()
    assert.is_true(asked_busy > asked)
    asked = asked_busy
    assert.is_true(lock:extend(5))
    assert.is_true(lock:ttl() > 4)
    assert.is_true(lock:release())
    local _, asked_after = cl:redirects()
    assert.is_true(asked_after >= asked + 2)
    cl:end_move(slot, from, to)
    assert.are.equal("0", to:cli("EXISTS", "lock:{asking}"))
  end)

  it("rides out TRYAGAIN while a slot moves when it may wait", function()
    local key = "tryagain"
    local old = assert(c:acquire(key, 5))
    assert.is_true(old:release()) -- the slot's fence record stays (and moves with the slot)
    local slot, from, to = cl:where(key)
    cl:begin_move(slot, from, to)
    cl:move_keys(slot, from, to)
    -- Half moved: a new lock's names are missing on both nodes, so the
    -- target answers TRYAGAIN to its scripts until the move ends.
    local lock, err = c:acquire(key, 5)
    assert.is_nil(lock)
    assert.matches("^redis: TRYAGAIN", err)
    -- The move ends 0.5 s from now, while the acquire below waits.
    local id, steps = cl:id(to), {}
    for _, n in ipairs({ to, from }) do
      steps[#steps + 1] = "redis-cli -p " .. n.port .. " CLUSTER SETSLOT " .. slot .. " NODE " .. id .. " >/dev/null"
    end
    local t0 = core.now()
    os.execute("(sleep 0.5; " .. table.concat(steps, "; ") .. ") >/dev/null 2>&1 &")
    lock = assert(c:acquire(key, 5, { wait = 3 }))
    assert.is_true(core.now() - t0 > 0.4)
    cl:end_move(slot, from, to) -- the other masters
    assert.is_true(lock.fence > old.fence)
    assert.are.equal(lock.token, to:cli("GET", "lock:{tryagain}"))
    assert.is_true(lock:release())
  end)

  it("answers busy for a lock held on the source while its slot moves (not TRYAGAIN)", function()
    local other = client()
    local key = "moving:held"
    local lock = assert(c:acquire(key, 5))
    local slot, from, to = cl:where(key)
    cl:begin_move(slot, from, to)
    -- The take finds the lock held; the acquire script's waiters mark (and
    -- the holder's fence key: a take keeps none) are missing on the source:
    -- its keys are in part there, in part nowhere, and Redis says TRYAGAIN.
    local none, err = other:acquire(key, 5)
    assert.is_nil(none)
    assert.matches('^busy: "moving:held" is held by another owner %(%d', err)
    cl:move_keys(slot, from, to)
    cl:end_move(slot, from, to)
    assert.is_true(lock:release())
    other:close()
  end)

  it("releases a read hold, a write hold and a permit while their slot is half moved (each its key alone)", function()
    local holds = {
      read = function() return c:rwlock("moving:r"):read(30) end,
      write = function() return c:rwlock("moving:w"):write(30) end,
      permit = function() return c:semaphore("moving:p", 2):acquire(30) end,
    }
    local keys = { read = "lock:{moving:r}:rw:readers", write = "lock:{moving:w}:rw:writer",
                   permit = "lock:{moving:p}:permits" }
    for what, take in pairs(holds) do
      local hold = assert(take())
      local slot, from, to = cl:where(hold.key)
      cl:begin_move(slot, from, to)
      -- The release script's keys are in part on the source, in part
      -- nowhere: Redis says TRYAGAIN to it, and the hold's key alone goes.
      local t0 = core.now()
      assert.is_true(hold:release(), what)
      assert.is_true(core.now() - t0 < 0.5, what .. " took " .. (core.now() - t0) .. " s")
      -- Gone from the source (a set empties away): 0, or ASK, which a
      -- migrating source answers for a key it does not have.
      local there = from:cli("EXISTS", keys[what])
      assert.is_truthy(there == "0" or there:match("^ASK"), what .. " still held: " .. there)
      cl:move_keys(slot, from, to)
      cl:end_move(slot, from, to)
    end
  end)

  -- Four processes looping with_lock on one key through the cluster for
  -- seconds (6) across event(slot, owner), 2 s in; returns the sections
  -- (helpers.loops_across).
  -- With elect, five processes campaign in the election named key.
  local function loops(key, event, fences, seconds, elect)
    local slot = core.lock_slot(elect and "election:" .. key or key)
    local owner = cl:owner(slot)
    return helpers.loops_across(function(start_at)
      return helpers.spawn(helpers.spec_dir .. "workers/loop.lua", "cluster:" .. table.concat(cl.seeds, ","), key,
                           seconds or 6, start_at, elect and "elect" or nil)
    end, function() event(slot, owner) end, fences, elect and 5)
  end

  -- How many sections ran on node n.
  local function on(sections, n)
    local count = 0
    for _, s in ipairs(sections) do if s.port == n.port then count = count + 1 end end
    return count
  end

  -- Loops (as loops(), or run: the same under OpenResty; elect:
  -- campaigns) while their slot moves to another master in steps; checks
  -- that more than 10 sections ran there.
  local function loops_across_move(key, elect, run)
    local to
    local sections = (run or loops)(key, function(slot, from)
      to = cl:other_master(from)
      cl:move_in_steps(slot, from, to)
    end, true, 6, elect)
    assert.is_true(on(sections, to) > 10, "sections on the new owner: " .. on(sections, to))
  end

  -- Loops (as loops(), or run) across a CLUSTER FAILOVER of their master;
  -- checks that more than 10 sections ran on the new master.
  local function loops_across_failover(key, run)
    local new
    local sections = (run or loops)(key, function(slot, old)
      new = cl:replica_of(old)
      assert.are.equal("OK", new:cli("CLUSTER", "FAILOVER"))
      assert.is_truthy(helpers.eventually(10, function() return cl:owner(slot, new) == new end))
    end, true)
    assert.is_true(cl:settled(20), "the cluster did not settle after the failover")
    assert.is_true(on(sections, new) > 10, "sections on the new master: " .. on(sections, new))
  end

  -- it(name, run), pending where the suite runs slowed down
  -- (REDISLOCK_SLOW): run's loops are timed for the machine's own speed.
  local function timing_bound(name, run)
    it(name, function()
      if helpers.slow > 1 then return pending("timing-bound: not under REDISLOCK_SLOW") end
      run()
    end)
  end

  timing_bound("keeps with_lock loops going while their slot moves: no overlaps, fences growing",
               function() loops_across_move("migrating") end)

  timing_bound("keeps one leader at a time among five processes while the election's slot moves, terms growing",
               function() loops_across_move("elected", true) end)

  it("renews a held lock across its slot's move (the watchdog follows MOVED)", function()
    local key = "renewed"
    local slot = core.lock_slot(key)
    local moved_to
    local ok, err = pcall(c.with_lock, c, key, 0.6, function(lock)
      core.sleep(0.3)
      local _, to = cl:move(slot)
      moved_to = to
      core.sleep(1.5) -- more than twice the TTL: only renewals on the new owner keep it
      assert.is_true(lock:check())
      assert.is_true(tonumber(to:cli("PTTL", "lock:{renewed}")) > 0)
    end)
    assert.is_true(ok, tostring(err))
    assert.are.equal("0", moved_to:cli("EXISTS", "lock:{renewed}"))
  end)

  it("wakes a waiter blocked on the old owner: it waits on the new one and is woken there", function()
    local key = "woken"
    local slot = core.lock_slot(key)
    local lock = assert(c:acquire(key, 20))
    local w = helpers.spawn(helpers.spec_dir .. "workers/waiter.lua", "cluster:" .. table.concat(cl.seeds, ","), key,
                            20, "notify", "plain", 0, "w")
    assert.is_truthy(helpers.eventually(5, function() return (c:command("LLEN", "pids")) == 1 end))
    core.sleep(0.3) -- blocked on the owner's wake-up list
    local _, to = cl:move(slot)
    core.sleep(0.5) -- the server let the waiter go (MOVED); it waits on the new owner
    local released = core.now()
    assert.is_true(lock:release())
    local out, ok = w.wait()
    assert.is_true(ok, out)
    assert.matches("^got w %d+", out)
    assert.is_true(core.now() - released < 1, "woken " .. (core.now() - released) .. " s after the release")
    assert.are.equal("0", to:cli("EXISTS", "lock:{woken}"))
    assert(c:command("DEL", "pids") and c:command("DEL", "order"))
  end)

  timing_bound("keeps with_lock loops going across a CLUSTER FAILOVER of their master",
               function() loops_across_failover("takeover") end)

  timing_bound("keeps with_lock loops going while their master stops answering until its replica takes over", function()
    local old, new
    local sections = loops("stopped", function(slot, owner)
      old, new = owner, cl:replica_of(owner)
      os.execute("kill -STOP " .. old.pid)
      local promoted = helpers.eventually(15, function() return cl:owner(slot, new) == new end)
      os.execute("kill -CONT " .. old.pid) -- it comes back as a replica of the new master
      assert.is_truthy(promoted, "the replica was never promoted")
    end, false, 12) -- the promotion takes the node timeout (2 s) and an election: loops long enough to go on after
    assert.is_true(cl:settled(30), "the cluster did not settle after the failover")
    assert.is_true(on(sections, new) > 10, "sections on the new master: " .. on(sections, new))
  end)

  it("gives up after a few redirects, naming the slot (a move half set up: ASK one way, MOVED back)", function()
    local key = "pingpong"
    local slot, from, to = cl:where(key)
    -- MIGRATING on the owner without IMPORTING on the target: the owner
    -- answers ASK (the keys are not there), the target MOVED (not importing).
    assert.are.equal("OK", from:cli("CLUSTER", "SETSLOT", slot, "MIGRATING", cl:id(to)))
    finally(function() from:cli("CLUSTER", "SETSLOT", slot, "STABLE") end)
    local t0 = core.now()
    local lock, err = c:acquire(key, 5)
    assert.is_nil(lock)
    assert.matches("^redis: slot " .. slot .. " was redirected 5 times %(", err)
    assert.is_true(core.now() - t0 < 1)
    assert.are.equal("OK", from:cli("CLUSTER", "SETSLOT", slot, "STABLE"))
    lock = assert(c:acquire(key, 5))
    assert.is_true(lock:release())
  end)

  it("waits fairly, and takes over a lock by its token, in cluster mode too", function()
    local key = "fair"
    local holder = assert(c:acquire(key, 10))
    local w = helpers.spawn(helpers.spec_dir .. "workers/waiter.lua", "cluster:" .. table.concat(cl.seeds, ","), key,
                            10, "notify", "fair", 0, "f")
    assert.is_truthy(helpers.eventually(5, function()
      return cl:owner(core.lock_slot(key)):cli("ZCARD", "lock:{fair}:queue") == "1"
    end))
    local other = client()
    local same = other:from_token(key, holder.token)
    assert.is_true(same:extend(10))
    assert.is_true(same:release())
    local out, ok = w.wait()
    assert.is_true(ok, out)
    assert.matches("^got f %d+", out)
    assert(c:command("DEL", "pids") and c:command("DEL", "order"))
    other:close()
  end)

  it("checks its options", function()
    local refused = helpers.new_fails
    refused({ cluster = {} }, "option 'cluster' must be a non-empty list of \"host:port\"")
    refused({ cluster = "h:1" }, "option 'cluster' must be a non-empty list")
    refused({ cluster = { "a:b:c" } }, "option 'cluster' item 1 must be \"host:port\"")
    refused({ cluster = { 7 } }, "option 'cluster' item 1 must be \"host:port\" or { host =, port = }")
    refused({ cluster = { "h:1" }, db = 2 }, "option 'db' must be 0 with 'cluster'")
    refused({ cluster = { "h:1" }, url = "redis://h" }, "option 'url' contradicts 'cluster'")
    refused({ cluster = { "h:1" }, sentinels = { "h:2" }, master = "m" }, "contradicts")
    assert.is_truthy(redislock.new({ cluster = { { host = "h", port = 7000 }, "h2" }, db = 0 }))
  end)

  -- Redis Cluster under OpenResty, in a real nginx (2 workers) in front of a
  -- real cluster (3 masters, 3 replicas; spec/helpers.lua): each worker's
  -- client routes over cosockets (a pool per node), follows redirects, and its
  -- renewal timer follows a slot that moves. The handlers are
  -- spec/support/ngx_app.lua's. LuaJIT pass only (nginx loads that build).
  describe("under OpenResty", function()
    if helpers.no_nginx(pending) then return end

    local nginx, data

    lazy_setup(function()
      data = redislock.new({ cluster = cl.seeds })
      local location = helpers.location
      nginx = helpers.start_nginx({
        workers = 2,
        http = "lua_socket_log_errors off;",
        server = {
          'set $redis_cluster "' .. table.concat(cl.seeds, ",") .. '";',
          location("/counter", "counter"),
          location("/acquire", "acquire"),
          location("/with_lock", "with_lock"),
          location("/election", "election"),
          location("/section", "section"),
          location("/tls/new", "new", 'set $redis_tls "mtls"; set $redis_tls_dir "' .. helpers.tls_certs() .. '";'),
        },
      })
    end)
    lazy_teardown(function()
      if data then data:close() end
      if nginx then nginx:stop() end
    end)

    local function get(path)
      return http.request(nginx.port, "GET", path)
    end

    -- Four requests looping /section on key (spec/workers/http_loop.lua)
    -- for 6 s across event(slot, owner), 2 s in; returns the sections
    -- (helpers.loops_across, fences checked): loops() under OpenResty.
    local function http_loops(key, event)
      local slot = core.lock_slot(key)
      local owner = cl:owner(slot)
      return helpers.loops_across(function(start_at)
        return helpers.spawn(helpers.spec_dir .. "workers/http_loop.lua", nginx.port, "/section?key=" .. key, 6,
                             start_at)
      end, function() event(slot, owner) end, true)
    end

    it("runs an election over cosockets: campaign, leader, proclaim, observe, resign, terms growing", function()
      nginx:elections()
    end)

    it("takes locks on every master, each at its slot's owner", function()
      local masters = {}
      for i = 1, 30 do
        local key = "o:spread:" .. i
        local status, body = get("/acquire?key=" .. key .. "&ttl=5")
        assert.are.equal(200, status, body .. nginx:error_log())
        local owner = cl:owner(core.lock_slot(key))
        assert.are.equal(body:match("^%d+ (%S+)"), owner:cli("GET", "lock:{" .. key .. "}"))
        masters[owner.port] = true
      end
      local n = 0
      for _ in pairs(masters) do n = n + 1 end
      assert.are.equal(3, n)
    end)

    for _, mode in ipairs({ "notify", "fair" }) do
      it("keeps 200 concurrent read-modify-writes exact under with_lock (" .. mode .. ")", function()
        assert.are.equal(2, nginx:counter(200, mode, data)) -- both workers answered
      end)
    end

    timing_bound("keeps with_lock loops going while their slot moves: no overlaps, fences growing",
                 function() loops_across_move("o:migrating", false, http_loops) end)

    timing_bound("keeps with_lock loops going across a CLUSTER FAILOVER of their master",
                 function() loops_across_failover("o:takeover", http_loops) end)

    it("refuses TLS without a server_name at new(): nginx checks DNS names, the cluster names addresses", function()
      local status, body = get("/tls/new")
      assert.are.equal(500, status)
      assert.matches("TLS to a cluster needs 'tls.server_name'", body, 1, true)
    end)

    it("renews a held lock across its slot's move (the worker's timer follows MOVED)", function()
      local key = "o:renewed"
      local slot = core.lock_slot(key)
      local hold = http.start(nginx.port, "GET", "/with_lock?key=" .. key .. "&ttl=0.6&hold=2", { timeout = 30 })
      assert.is_truthy(helpers.eventually(5, function()
        return cl:owner(slot):cli("EXISTS", "lock:{" .. key .. "}") == "1"
      end))
      local _, to = cl:move(slot)
      assert.is_truthy(helpers.eventually(1, function()
        return tonumber(to:cli("PTTL", "lock:{" .. key .. "}")) > 0
      end))
      local status, body = hold:finish()
      assert.are.equal(200, status, body .. nginx:error_log())
      assert.are.equal("0", to:cli("EXISTS", "lock:{" .. key .. "}"))
    end)
  end)
end)

describe("Redis Cluster over TLS, with a password", function()
  local cl

  lazy_setup(function() cl = helpers.start_cluster({ masters = 3, replicas = 0, tls = true, password = "s3cret" }) end)
  lazy_teardown(function() if cl then cl:stop() end end)

  local function client(extra)
    local o = helpers.tls_opts(nil, { cluster = { "127.0.0.1:" .. cl.nodes[1].port }, password = "s3cret" })
    o.host, o.tls.server_name = nil, "localhost" -- the nodes are named by address; their certificate by name
    for k, v in pairs(extra or {}) do o[k] = v end
    return redislock.new(o)
  end

  it("takes locks on every master over verified TLS, and follows a slot that moved", function()
    local c = client()
    assert.are.equal(3, cl:spread(c, "tls:", 30))
    -- Move a slot between masters: the client follows MOVED, over TLS.
    local key = "tls:moved"
    local slot = core.lock_slot(key)
    assert(assert(c:acquire(key, 5)):release())
    local _, to = cl:move(slot)
    local lock = assert(c:acquire(key, 5))
    assert.are.equal(lock.token, to:cli("GET", "lock:{tls:moved}"))
    assert.is_true(lock:release())
    c:close()
  end)

  it("says so when the password is wrong or TLS is missing", function()
    for _, case in ipairs({
      { client({ password = "wrong" }), "^redis: no cluster node would tell its slots %(redis: AUTH refused" },
      { redislock.new({ cluster = { "127.0.0.1:" .. cl.nodes[1].port }, password = "s3cret" }),
        "^connection: no cluster node reachable" },
    }) do
      helpers.acquire_fails(case[1], "tls:x", case[2])
      case[1]:close()
    end
  end)
end)
