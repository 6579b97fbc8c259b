-- SPDX-License-Identifier: MIT
-- The handoff (csrc/scripts/README.md, "Handing over"): a release that finds a
-- registered waiter hands it the lock in the same script, and the waiter's
-- wake-up carries its fence, so that it holds the lock with no try of its
-- own after the release. The proofs are counts the server keeps (scripts
-- run), the lock's value on the server, and, for the waiters that are gone
-- (SIGKILL, SIGSTOP, given up), how long the next holder waited: bounds
-- well inside the TTL the gone waiter registered with. Exclusion and fences
-- with several OS processes. Both transports.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")

-- How long a lock handed to a waiter that is gone can keep the others out:
-- RL_CLAIM_MS (0.5 s), then the next waiter's block (1 s at most) ends and
-- its try takes the lock back; with room for a loaded machine.
local GONE_BOUND = 2

describe("the handoff", function()
  local srv, raw, holder

  helpers.client_each(function(s, r, c)
    srv, raw, holder = s, r, c
    assert(holder._transport:eval("acquire_wait", "warm-up:wait", core.token(), 1000, { n = 1000 }))
    helpers.warm(holder, raw)
  end)

  local function blocked() return helpers.blocked(raw) end
  local function scripts_run() return helpers.scripts_run(raw) end

  -- Waits (5 s at most) until n clients are blocked in the server; who
  -- ("the waiter" if not given) never blocked otherwise.
  local function blocked_by(n, who)
    assert.is_truthy(helpers.eventually(5, function() return blocked() == n end), (who or "the waiter")
                     .. " never blocked")
  end

  -- Releases hold while a waiter is blocked; checks that the key name
  -- holds another token as the release returns, with the TTL the waiter
  -- asked (30 s): what (the lock) was handed over. Returns that token, and
  -- the count of scripts run before the release.
  local function handed_over(hold, name, what)
    local before = scripts_run()
    assert.is_true(hold:release())
    local value = raw:command("GET", name)
    assert.is_truthy(value and value ~= hold.token, what .. " is not handed over")
    assert.is_true(raw:command("PTTL", name) > 29000)
    return value, before
  end

  -- Registers token (a new one if not given) as a waiter by the script op
  -- on key (acquire_wait, sem_acquire_wait ...; n: its n, 30000 if not
  -- given), as a process that never takes its wake-up would; checks that
  -- the script answered -1 (wait). Returns the token.
  local function registered(op, key, n, token)
    token = token or core.token()
    assert.are.equal(-1, (holder._transport:eval(op, key, token, 30000, { n = n or 30000 })))
    return token
  end

  -- waiter(key, wait, mode, kind, hold, tag[, ttl[, may-lose]]): a process
  -- (spec/workers/waiter.lua).
  local function waiter(...)
    return helpers.spawn(helpers.spec_dir .. "workers/waiter.lua", srv.port, ...)
  end

  -- "got <tag> <fence> <when>" of a waiter's output: fence and when.
  local function got(p, tag)
    local out, ok = p.wait()
    assert.is_true(ok, out)
    local fence, when = out:match("^got " .. tag .. " (%d+) ([%d.]+)")
    assert.is_truthy(fence, out)
    return tonumber(fence), tonumber(when), out
  end

  for _, kind in ipairs({ "plain", "fair" }) do
    it("gives the lock to a blocked waiter in the release (" .. kind .. "): no try of its own after it", function()
      -- A name of its own: the holder's process remembers the names whose
      -- last release found somebody waiting (and sends their next release
      -- whole at once), so the count below is that of a first release.
      local k = "k-" .. kind
      local name = "lock:{" .. k .. "}"
      local lock = assert(holder:acquire(k, 30))
      local p = waiter(k, 10, "notify", kind, 1, "w")
      blocked_by(1)
      -- The lock is the waiter's as the release returns: its token, its TTL.
      local value, before = handed_over(lock, name, "the lock")
      local fence = got(p, "w")
      assert.is_true(fence > lock.fence)
      -- The holder's release and the waiter's own: nothing in between.
      -- Each finds the waiters mark, so each sends its script twice (first
      -- with the names its common case needs, then with all).
      assert.are.equal(4, scripts_run() - before)
      assert.are.equal(0, raw:command("EXISTS", name .. ":signal:" .. value, name .. ":queue", name .. ":hand",
                                          name .. ":handoff"))
    end)
  end

  it("leaves a waiter with handoff = false to take the lock itself once woken", function()
    local lock = assert(holder:acquire("k-nohand", 30)) -- a name of its own, as above
    local p = waiter("k-nohand", 10, "notify", "nohand", 0, "w")
    blocked_by(1)
    local before = scripts_run()
    assert.is_true(lock:release())
    local out, ok = p.wait()
    assert.is_true(ok, out)
    -- The holder's release, the waiter's try after its wake-up, its release
    -- (each release twice, as above).
    assert.are.equal(5, scripts_run() - before)
  end)

  -- Notify waiters are handed the lock by when they last renewed their
  -- registration (about the order they came in; fair = true keeps it).
  it("hands the lock to each registered waiter in turn, with growing fences", function()
    local lock = assert(holder:acquire("k", 30))
    local procs = {}
    for i = 1, 4 do
      procs[i] = waiter("k", 20, "notify", "plain", 0.2, "w" .. i)
      blocked_by(i, "waiter " .. i)
    end
    assert.is_true(lock:release())
    local fences = {}
    for i = 1, 4 do fences["w" .. i] = got(procs[i], "w" .. i) end
    local order = raw:command("LRANGE", "order", 0, -1)
    local tags = {}
    for i, tag in ipairs(order) do tags[i] = tag end
    table.sort(tags)
    assert.are.same({ "w1", "w2", "w3", "w4" }, tags)
    local last = lock.fence
    for _, tag in ipairs(order) do
      assert.is_true(fences[tag] > last, tag .. "'s fence " .. fences[tag] .. " after " .. last)
      last = fences[tag]
    end
  end)

  it("takes back a lock handed to a waiter that never took it up, within RL_CLAIM_MS", function()
    -- A waiter registered by hand, as a process that died before it blocked:
    -- nothing will take its wake-up.
    local lock = assert(holder:acquire("k", 30))
    local gone = registered("acquire_wait", "k")
    local released = core.now()
    assert.is_true(lock:release())
    assert.are.equal(gone, raw:command("GET", "lock:{k}"))
    local other = srv:client()
    local next_lock = assert(other:acquire("k", 5, { wait = 10 }))
    local waited = core.now() - released
    assert.is_true(waited >= 0.45 and waited < GONE_BOUND * helpers.slow, "waited " .. waited .. " s")
    assert.is_true(next_lock.fence > lock.fence)
    -- The wake-up went with it: a waiter that comes late finds nothing.
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}:signal:" .. gone))
    assert.are.equal(next_lock.token, raw:command("GET", "lock:{k}"))
    other:close()
  end)

  it("never lets a wake-up outlive the lock it handed over (force_release, a lock key gone)", function()
    local function handed_to(tok)
      local lock = assert(holder:acquire("k", 30))
      registered("acquire_wait", "k", nil, tok)
      assert.is_true(lock:release())
      assert.are.equal(tok, raw:command("GET", "lock:{k}"))
      assert.are.equal(1, raw:command("LLEN", "lock:{k}:signal:" .. tok))
    end
    -- Forced release: the wake-up goes with the lock.
    local a = core.token()
    handed_to(a)
    assert.is_true(holder:force_release("k"))
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}:signal:" .. a))
    -- The key gone otherwise (here DEL; an eviction alike): the waiter's next
    -- try finds the lock another's and empties its list before it blocks.
    local b = core.token()
    handed_to(b)
    assert.are.equal(1, raw:command("DEL", "lock:{k}"))
    local other = assert(srv:client():acquire("k", 30))
    registered("acquire_wait", "k", nil, b)
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}:signal:" .. b))
    assert.is_true(other:release()) -- handed to b, registered again: a wake-up of its own
    assert.are.equal(b, raw:command("GET", "lock:{k}"))
    assert.is_true(tonumber(raw:command("LINDEX", "lock:{k}:signal:" .. b, -1):match("^(%d+) ")) > other.fence)
  end)

  it("passes on a lock handed to a waiter that gives up at that moment", function()
    local lock = assert(holder:acquire("k", 30))
    local quitter = registered("acquire_wait", "k")
    local p = waiter("k", 10, "notify", "plain", 0, "next")
    blocked_by(1)
    assert.is_true(lock:release())
    assert.are.equal(quitter, raw:command("GET", "lock:{k}")) -- first registered: handed the lock
    local left = core.now()
    holder._transport:eval("leave", "k", quitter, 30000)
    local _, when = got(p, "next")
    assert.is_true(when - left < 0.4 * helpers.slow, "passed on after " .. (when - left) .. " s")
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}:signal:" .. quitter))
  end)

  -- What the waiter specs below hold for kind ("write": a read-write lock's
  -- writer, on "doc"; else a lock, on "k"): the key, the hold taken by the
  -- spec (30 s), the key holding its token, and the kind of a next waiter.
  local function held(kind)
    if kind == "write" then return "doc", assert(holder:rwlock("doc"):write(30)), "lock:{doc}:rw:writer", "write" end
    return "k", assert(holder:acquire("k", 30)), "lock:{k}", "plain"
  end

  -- A waiter of kind ("plain" or "write") SIGKILLed while registered is
  -- handed the hold; the next waiter takes it back after RL_CLAIM_MS, within
  -- the bound, with a higher fence.
  local function killed_waiter(kind)
    local key, lock, lock_key, next_kind = held(kind)
    local dead = waiter(key, 20, "notify", kind, 0, "dead")
    blocked_by(1)
    local alive = waiter(key, 20, "notify", next_kind, 0, "alive")
    blocked_by(2, "the second waiter")
    assert.is_true(helpers.sh_ok("kill -KILL " .. helpers.pid_of(raw, 1)))
    dead.wait()
    local released = core.now()
    assert.is_true(lock:release()) -- handed to the dead one (registered first, TTL 30 s)
    local heir = raw:command("GET", lock_key)
    assert.is_truthy(heir and heir ~= lock.token, "not handed over")
    local fence, when, out = got(alive, "alive")
    assert.is_falsy(out:find(heir, 1, true))
    local waited = when - released
    assert.is_true(waited >= 0.45 and waited < GONE_BOUND * helpers.slow, "the next holder waited " .. waited .. " s")
    assert.is_true(fence > lock.fence)
  end

  it("keeps a waiter SIGKILLed while registered from holding the others up past the bound", function()
    killed_waiter("plain")
  end)

  it("hands a waiter that renews a first TTL of 3 s, which its renewal extends at once", function()
    local lock = assert(holder:acquire("k", 30))
    local p = waiter("k", 10, "notify", "renew", 1, "w", 30)
    blocked_by(1)
    -- Paused, it cannot renew before the TTL it was handed is read (under
    -- valgrind this spec reads slower than the waiter renews).
    local pid = helpers.pid_of(raw, 1)
    assert.is_true(helpers.sh_ok("kill -STOP " .. pid))
    assert.is_true(lock:release())
    local left = raw:command("PTTL", "lock:{k}")
    assert.is_true(helpers.sh_ok("kill -CONT " .. pid))
    assert.is_true(left > 0 and left <= 3000, "handed over with " .. left .. " ms")
    assert.is_truthy(helpers.eventually(helpers.slow, function() return raw:command("PTTL", "lock:{k}") > 25000 end),
                     "the renewal did not extend the lock it was handed")
    got(p, "w")
  end)

  -- A waiter (kind: "plain" or "renew", TTL ttl; "write": a read-write
  -- lock's writer, on "doc") SIGSTOPped as it blocks is handed the lock; the
  -- next waiter gets it after at least low s and at most high; resumed, the
  -- paused one finds its lock lost, its fence the lower.
  local function paused_waiter(kind, ttl, low, high)
    local key, lock, _, next_kind = held(kind)
    local paused = waiter(key, 20, "notify", kind, 0, "paused", ttl, "may-lose")
    blocked_by(1)
    local next_one = waiter(key, 20, "notify", next_kind, 0, "next")
    blocked_by(2, "the second waiter")
    local pid = helpers.pid_of(raw, 1)
    assert.is_true(helpers.sh_ok("kill -STOP " .. pid))
    -- Resumed whatever fails below: a worker left stopped would hang the
    -- suite as busted waits for it at exit.
    finally(function() helpers.sh_ok("kill -CONT " .. pid) end)
    local released = core.now()
    assert.is_true(lock:release()) -- handed to the paused one: Redis serves its BLPOP all the same
    local fence, when = got(next_one, "next")
    local waited = when - released
    assert.is_true(waited > low and waited < high * helpers.slow, "the next holder waited " .. waited .. " s")
    assert.is_true(helpers.sh_ok("kill -CONT " .. pid))
    local pfence, _, out = got(paused, "paused")
    assert.is_truthy(out:match("release: lost"), out)
    assert.is_true(pfence < fence)
  end

  it("lets a waiter SIGSTOPped while registered keep what it was handed for its TTL at most", function()
    paused_waiter("plain", 1.5, 1.3, 1.5 + GONE_BOUND)
  end)

  it("keeps a renewing waiter SIGSTOPped while registered from holding the others up past 3 s and a step", function()
    -- Its TTL is 30 s; handed over, its first TTL is 3 s.
    paused_waiter("renew", 30, 2.9, 3 + GONE_BOUND)
  end)

  it("keeps exclusion and growing fences with 4 processes looping on one key", function()
    local sections = helpers.loops_across(function(start_at)
      return helpers.spawn(helpers.spec_dir .. "workers/loop.lua", srv.port, "loop", 3, start_at)
    end, function() end, true)
    assert.is_true(#sections > 100, "only " .. #sections .. " sections")
  end)

  describe("of a semaphore's permit", function()
    it("gives the permit to a blocked waiter in the release: no try of its own after it", function()
      local permit = assert(holder:semaphore("pool", 1):acquire(30))
      local p = waiter("pool", 10, "notify", "sem", 0.5, "w")
      blocked_by(1)
      local before = scripts_run()
      assert.is_true(permit:release())
      local members = raw:command("ZRANGE", "lock:{pool}:permits", 0, -1)
      assert.are.equal(1, #members)
      assert.are_not.equal(permit.token, members[1])
      local fence = got(p, "w")
      assert.is_true(fence > permit.fence)
      assert.are.equal(2, scripts_run() - before) -- the two releases
    end)

    it("takes back a permit handed to a waiter gone, within RL_CLAIM_MS", function()
      local sem = holder:semaphore("pool", 1)
      local permit = assert(sem:acquire(30))
      local gone = registered("sem_acquire_wait", "pool", 1)
      local released = core.now()
      assert.is_true(permit:release())
      assert.is_truthy(raw:command("ZSCORE", "lock:{pool}:permits", gone))
      local other = srv:client()
      local next_permit = assert(other:semaphore("pool", 1):acquire(5, { wait = 10 }))
      local waited = core.now() - released
      assert.is_true(waited >= 0.45 and waited < GONE_BOUND * helpers.slow, "waited " .. waited .. " s")
      assert.is_true(next_permit.fence > permit.fence)
      assert.are.equal(0, raw:command("EXISTS", "lock:{pool}:permits:signal:" .. gone))
      assert.are.same({ next_permit.token }, raw:command("ZRANGE", "lock:{pool}:permits", 0, -1))
      other:close()
    end)

    it("answers a waiter's next try with the fence it was handed, and leave gives back what a token holds", function()
      local t = holder._transport
      local sem = holder:semaphore("pool", 2)
      local a, b = assert(sem:acquire(30)), assert(sem:acquire(30))
      local w = registered("sem_acquire_wait", "pool", 2)
      assert.is_true(a:release()) -- handed to w, whose wake-up nobody takes yet
      local handed = tonumber(raw:command("LINDEX", "lock:{pool}:permits:signal:" .. w, -1):match("^(%d+) "))
      assert.is_true(b:release())
      local x = assert(sem:acquire(30)) -- another holder beside w, with a newer fence
      assert.is_true(x.fence > handed)
      local status, fence = t:eval("sem_acquire_wait", "pool", w, 30000, { n = 2 })
      assert.are.equal(1, status)
      assert.are.equal(handed, fence) -- its own, handed with the permit: not a new one
      assert.are.equal(0, raw:command("EXISTS", "lock:{pool}:permits:signal:" .. w))
      -- A waiter that gives up gives back what its token holds (an acquire
      -- whose answer was lost, here w's permit).
      t:eval("sem_leave", "pool", w)
      assert.is_false(raw:command("ZSCORE", "lock:{pool}:permits", w))
      assert.are.equal(1, sem:count())
      assert.is_true(x:release())
    end)

    it("passes on a permit handed to a waiter that gives up at that moment", function()
      local sem = holder:semaphore("pool", 1)
      local permit = assert(sem:acquire(30))
      local quitter = registered("sem_acquire_wait", "pool", 1)
      local p = waiter("pool", 10, "notify", "sem", 0, "next")
      blocked_by(1)
      assert.is_true(permit:release())
      assert.is_truthy(raw:command("ZSCORE", "lock:{pool}:permits", quitter)) -- registered first
      local left = core.now()
      holder._transport:eval("sem_leave", "pool", quitter)
      local _, when = got(p, "next")
      assert.is_true(when - left < 0.4 * helpers.slow, "passed on after " .. (when - left) .. " s")
      assert.are.equal(0, raw:command("EXISTS", "lock:{pool}:permits:signal:" .. quitter))
    end)
  end)

  describe("of a read-write lock's write lock", function()
    local WRITER = "lock:{doc}:rw:writer"

    it("gives the write lock to a blocked writer in the write release: no try of its own after it", function()
      local w = assert(holder:rwlock("doc"):write(30))
      local p = waiter("doc", 10, "notify", "write", 0.5, "w")
      blocked_by(1, "the writer")
      local _, before = handed_over(w, WRITER, "the write lock")
      assert.are.equal(0, raw:command("ZCARD", "lock:{doc}:rw:writers"))
      local fence = got(p, "w")
      assert.is_true(fence > w.fence)
      assert.are.equal(2, scripts_run() - before) -- the two releases
    end)

    it("gives the write lock to a blocked writer in the last reader's release", function()
      local doc = holder:rwlock("doc")
      local r1, r2 = assert(doc:read(30)), assert(srv:client():rwlock("doc"):read(30))
      local p = waiter("doc", 10, "notify", "write", 0.5, "w")
      blocked_by(1, "the writer")
      local before = scripts_run()
      assert.is_true(r1:release())
      assert.are.equal(false, raw:command("GET", WRITER)) -- a reader is still in
      assert.is_true(r2:release())
      local value = raw:command("GET", WRITER)
      assert.is_truthy(value, "the write lock is not handed over")
      local fence = got(p, "w")
      assert.is_true(fence > math.max(r1.fence, r2.fence))
      assert.are.equal(3, scripts_run() - before) -- the three releases
    end)

    it("takes back a write lock handed to a writer gone, within RL_CLAIM_MS, for readers and writers", function()
      for _, next_kind in ipairs({ "read", "write" }) do
        assert.are.equal("OK", raw:command("FLUSHALL"))
        local w = assert(holder:rwlock("doc"):write(30))
        local gone = registered("write_acquire_wait", "doc")
        local released = core.now()
        assert.is_true(w:release())
        assert.are.equal(gone, raw:command("GET", WRITER))
        local other = srv:client()
        local doc = other:rwlock("doc")
        local hold = assert(doc[next_kind](doc, 5, { wait = 10 }))
        local waited = core.now() - released
        assert.is_true(waited >= 0.45 and waited < GONE_BOUND * helpers.slow, next_kind .. " waited " .. waited .. " s")
        assert.is_true(hold.fence > w.fence)
        assert.are.equal(0, raw:command("EXISTS", "lock:{doc}:rw:signal:" .. gone))
        other:close()
      end
    end)

    it("lets a reader blocked before a write lock went to a writer gone in within the bound", function()
      local w = assert(holder:rwlock("doc"):write(20))
      local gone = registered("write_acquire_wait", "doc")
      local p = waiter("doc", 30, "notify", "read", 0, "r")
      blocked_by(1, "the reader")
      local released = core.now()
      assert.is_true(w:release())
      assert.are.equal(gone, raw:command("GET", WRITER)) -- handed over; the reader is not woken
      local fence, when = got(p, "r")
      local waited = when - released
      assert.is_true(waited >= 0.45 and waited < GONE_BOUND * helpers.slow, "the reader waited " .. waited .. " s")
      assert.is_true(fence > w.fence + 1) -- after the fence handed to the writer gone
    end)

    it("lets a writer SIGSTOPped while registered keep the write lock it was handed for its TTL at most", function()
      paused_waiter("write", 1.5, 1.3, 1.5 + GONE_BOUND)
    end)

    it("passes on a write lock handed to a writer that gives up at that moment", function()
      local w = assert(holder:rwlock("doc"):write(30))
      local quitter = registered("write_acquire_wait", "doc")
      local p = waiter("doc", 10, "notify", "write", 0, "next")
      blocked_by(1)
      assert.is_true(w:release())
      assert.are.equal(quitter, raw:command("GET", WRITER)) -- first registered: handed the lock
      local left = core.now()
      holder._transport:eval("write_leave", "doc", quitter)
      -- Woken by the leave: Redis served its BLPOP as the script ended, so
      -- nobody blocks any more (not so had it waited for its block's end).
      assert.are.equal(0, blocked())
      local _, when = got(p, "next")
      assert.is_true(when - left < 0.4 * helpers.slow, "passed on after " .. (when - left) .. " s")
      assert.are.equal(0, raw:command("EXISTS", "lock:{doc}:rw:signal:" .. quitter))
    end)

    it("keeps a writer SIGKILLed while registered from holding the others up past the bound", function()
      killed_waiter("write")
    end)
  end)

  describe("under OpenResty", function()
    if helpers.no_nginx(pending) then return end
    local ngx = helpers.app_nginx_for(function() return srv end, 1)

    it("hands the lock to a request that waits, over cosockets", function()
      local lock = assert(holder:acquire("busy", 30))
      local waiting = http.start(ngx.port, "GET", "/acquire?key=busy&wait=10&ttl=20")
      blocked_by(1)
      local before = scripts_run()
      assert.is_true(lock:release())
      local status, body = waiting:finish()
      assert.are.equal(200, status, body)
      local fence, token = body:match("^(%d+) (%S+)")
      assert.is_true(tonumber(fence) > lock.fence)
      assert.are.equal(token, raw:command("GET", "lock:{busy}"))
      -- The release alone: sent twice, the second time with the names of
      -- its wake-up ("busy" is released here once, so the holder's process
      -- does not know yet that somebody waits for it).
      assert.are.equal(2, scripts_run() - before)
    end)

    it("hands the write lock to a request that waits for it, over cosockets", function()
      local prim = helpers.start_primitive_nginx(srv)
      local ok, err = pcall(function()
        assert.are.equal("OK", raw:command("MSET", "readers", 0, "writers", 0)) -- the section's counters
        local w = assert(holder:rwlock("doc"):write(30))
        local waiting = http.start(prim.port, "GET", "/primitive?kind=write&hold=0.01")
        blocked_by(1, "the request")
        local before = scripts_run()
        assert.is_true(w:release())
        local status, body = waiting:finish()
        assert.are.equal(200, status, body .. prim:error_log())
        assert.is_true(tonumber(body:match("^(%d+)")) > w.fence, body)
        -- The release, the request's check and its release: no try after the wake-up.
        assert.are.equal(3, scripts_run() - before)
        assert.are.equal("0", raw:command("GET", "overlaps") or "0")
      end)
      prim:stop()
      assert(ok, err)
    end)
  end)
end)
