-- SPDX-License-Identifier: MIT
-- OpenResty under a stampede: the requests of one nginx worker that wait for
-- the same lock queue in the worker, and one of them waits on Redis for all;
-- the lock is handed down within the worker (at most 16 times in a row);
-- every worker's Redis connections stay within pool_size + wait_connections.
-- Real nginx instances (spec/support/ngx_app.lua's handlers: /crowd counts
-- who is inside at once) and a real redis-server. LuaJIT pass only.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")
local redislock = require("redislock")

local POOL, WAITS = 4, 2 -- each worker's pool_size and wait_connections

describe("a stampede under OpenResty", function()
  if helpers.no_nginx(pending) then return end
  local srv, raw
  helpers.redis_for(function(s, r) srv, raw = s, r end, { flush = true })

  -- An nginx in front of srv with `workers` workers, clients of POOL and
  -- WAITS connections (more: directives in its server block).
  local function start(workers, more)
    return helpers.start_nginx({
      workers = workers,
      http = "lua_socket_log_errors off;",
      reuseport = true,
      server = {
        helpers.redis_vars(srv),
        "set $redis_pool_size " .. POOL .. ";",
        "set $redis_wait_connections " .. WAITS .. ";",
        more or "",
        helpers.location("/crowd", "crowd"),
        helpers.location("/abandon", "abandon"),
        helpers.location("/leave", "leave"),
        helpers.location("/primitive", "primitive"),
      },
    })
  end

  local one, two_a, two_b -- nginx: 1 worker; and two of 2 workers
  lazy_setup(function()
    one, two_a, two_b = start(1), start(2), start(2)
  end)
  lazy_teardown(function()
    for _, n in ipairs({ one, two_a, two_b }) do n:stop() end
  end)

  local function clients_info(field)
    return tonumber(raw:command("INFO", "clients"):match(field .. ":(%d+)"))
  end

  -- The most connections to the server one process other than this one
  -- has open now (ss: the kernel's count, by process).
  local me = tostring(core.getpid())
  local function most_per_process()
    local p = assert(io.popen("ss -tnpH state established dport = :" .. srv.port .. " 2>/dev/null"))
    local per, most = {}, 0
    for pid in p:read("*a"):gmatch("pid=(%d+)") do
      if pid ~= me then
        per[pid] = (per[pid] or 0) + 1
        most = math.max(most, per[pid])
      end
    end
    p:close()
    return most
  end

  -- Sends every request of list ({ port, path } pairs) at once, then waits
  -- for them all, sampling the server's clients every few milliseconds.
  -- Returns the responses ({ status, body } in order, or { err } when the
  -- connection failed), the most connections one nginx worker had open at
  -- once, the most blocked clients seen, and how long it took.
  local function stampede(list)
    local began, pending_ = core.now(), {}
    for i, r in ipairs(list) do pending_[i] = http.start(r[1], "GET", r[2], { timeout = 60 * helpers.slow }) end
    local most, blocked, left = 0, 0, #list
    local done = {}
    while left > 0 do
      most = math.max(most, most_per_process())
      blocked = math.max(blocked, clients_info("blocked_clients"))
      for i, p in ipairs(pending_) do
        if not done[i] and p:ready() then
          local ok, status, body = pcall(p.finish, p)
          done[i] = ok and { status = status, body = body } or { err = status }
          left = left - 1
        end
      end
      core.sleep(0.005)
    end
    return done, most, blocked, core.now() - began
  end

  -- The sections of key, in the order they began: { fence, token, pid }.
  local function sections(key)
    local out = {}
    for i, s in ipairs(raw:command("LRANGE", "sections:" .. key, 0, -1)) do
      local fence, token, pid = s:match("^(%d+) (%S+) (%d+)$")
      out[i] = { fence = tonumber(fence), token = token, pid = pid }
    end
    return out
  end

  -- Whether the sections of key that ended (spans:<key>) never overlapped
  -- in time; and how many there were.
  local function apart(key)
    local spans = {}
    for i, s in ipairs(raw:command("LRANGE", "spans:" .. key, 0, -1)) do
      local enter, leave = s:match("^(%S+) (%S+)$")
      spans[i] = { tonumber(enter), tonumber(leave) }
    end
    table.sort(spans, function(x, y) return x[1] < y[1] end)
    for i = 2, #spans do
      if spans[i][1] < spans[i - 1][2] then
        return false, string.format("a section began at %.6f, before the one of %.6f ended at %.6f", spans[i][1],
                                    spans[i - 1][1], spans[i - 1][2])
      end
    end
    return true, #spans
  end

  it("keeps 400 requests on two nginx of 2 workers exclusive, and each worker's connections bounded", function()
    local list = {}
    for i = 1, 400 do
      list[i] = { (i % 2 == 0 and two_a or two_b).port, "/crowd?key=hot&wait=60&hold=0.001" }
    end
    local done, most, blocked = stampede(list)
    for i, r in ipairs(done) do
      assert.are.equal(200, r.status, "request " .. i .. ": " .. tostring(r.body or r.err))
    end
    assert.are.equal(0, tonumber(raw:command("GET", "overlaps:hot")) or 0)
    assert.are.same({ true, 400 }, { apart("hot") })
    -- Each of the 4 workers: at most POOL connections for calls and WAITS
    -- for waits, and at most one wait on Redis for this key (its pool
    -- would allow WAITS).
    assert.is_true(most <= POOL + WAITS, "connections of one worker: " .. most)
    assert.is_true(blocked <= 4, "blocked clients: " .. blocked)
    -- Handed down within a worker: the same token and fence, one after the
    -- other on one worker, at most 16 times in a row; fences never go back.
    local s = sections("hot")
    assert.are.equal(400, #s)
    local handed, run, longest = 0, 1, 1
    for i = 2, #s do
      assert.is_true(s[i].fence >= s[i - 1].fence, "fence " .. s[i].fence .. " after " .. s[i - 1].fence)
      if s[i].token == s[i - 1].token then
        assert.are.equal(s[i - 1].fence, s[i].fence)
        assert.are.equal(s[i - 1].pid, s[i].pid)
        handed, run = handed + 1, run + 1
        longest = math.max(longest, run)
      else
        assert.is_true(s[i].fence > s[i - 1].fence, "a new token with fence " .. s[i].fence)
        run = 1
      end
    end
    assert.is_true(handed > 0, "no lock was handed down")
    assert.is_true(longest <= 17, "one token held " .. longest .. " sections in a row")
    assert.are.equal(0, raw:command("EXISTS", "lock:{hot}"))
  end)

  it("holds the bound when the waiters do not coalesce (coalesce = false): they poll", function()
    local n = start(1, "set $redis_coalesce off;")
    local ok, err = pcall(function()
      local list = {}
      for i = 1, 100 do list[i] = { n.port, "/crowd?key=solo&wait=60&hold=0.001" } end
      local done, most, blocked = stampede(list)
      for i, r in ipairs(done) do
        assert.are.equal(200, r.status, "request " .. i .. ": " .. tostring(r.body or r.err))
      end
      assert.are.equal(0, tonumber(raw:command("GET", "overlaps:solo")) or 0)
      assert.is_true(most <= POOL + WAITS, "connections of one worker: " .. most)
      assert.is_true(blocked <= WAITS, "blocked clients: " .. blocked)
      -- No lock handed down: every section took the lock on Redis.
      local s, seen = sections("solo"), {}
      for _, x in ipairs(s) do
        assert.is_nil(seen[x.token])
        seen[x.token] = true
      end
    end)
    n:stop()
    assert(ok, err)
  end)

  it("answers busy to the waiters whose wait ran out in their worker's queue, and strands nothing", function()
    local holder = redislock.new{ port = srv.port }
    local lock = assert(holder:acquire("held", 5))
    local list = {}
    for i = 1, 50 do list[i] = { one.port, "/crowd?key=held&wait=0.3" } end
    local done, _, blocked, took = stampede(list)
    for i, r in ipairs(done) do
      assert.are.equal(409, r.status, "request " .. i)
      assert.matches('^busy: "held" is still held by another owner after waiting 0%.3 s %(%d', r.body)
    end
    assert.is_true(took < 2 * helpers.slow, "the busy answers took " .. took .. " s")
    assert.is_true(blocked <= 1)
    assert(lock:release())
    local began = core.now()
    local status, body = http.request(one.port, "GET", "/crowd?key=held&wait=1")
    assert.are.equal(200, status, body)
    assert.is_true(core.now() - began < 0.5 * helpers.slow)
    holder:close()
  end)

  it("replaces a worker's waiter on Redis whose request ended (ngx.exit): those behind it get the lock", function()
    local holder = redislock.new{ port = srv.port }
    local lock = assert(holder:acquire("gone", 5))
    -- The first waiter of the worker, which waits on Redis, killed after 0.3 s.
    local first = http.start(one.port, "GET", "/abandon?key=gone&after=0.3")
    assert.is_truthy(helpers.eventually(2, function() return clients_info("blocked_clients") == 1 end))
    local list = {}
    for i = 1, 20 do list[i] = { one.port, "/crowd?key=gone&wait=8" } end
    local pending_ = {}
    for i, r in ipairs(list) do pending_[i] = http.start(r[1], "GET", r[2]) end
    assert.are.equal(200, (first:finish()))
    core.sleep(0.5)
    assert(lock:release())
    local released = core.now()
    for i, p in ipairs(pending_) do
      local status, body = p:finish()
      assert.are.equal(200, status, "request " .. i .. ": " .. body)
    end
    -- Its place was taken at most a wait step (1 s), the client's timeout
    -- (1 s) and half a second after its last step began.
    assert.is_true(core.now() - released < 3 * helpers.slow, "took " .. core.now() - released .. " s")
    assert.are.equal(20, #sections("gone"))
    holder:close()
  end)

  it("frees the queue of a lock whose holder's request ended, once its renewal timer released it", function()
    -- The holder waited (so it keeps its worker's gate) and ends its request
    -- inside fn: its renewal timer releases the lock (within a third of its
    -- TTL), and the requests queued behind it go on.
    local began = core.now()
    local status = http.request(one.port, "GET", "/leave?key=left&ttl=1&how=exit&wait=1")
    assert.are.equal(200, status)
    local list = {}
    for i = 1, 20 do list[i] = { one.port, "/crowd?key=left&wait=8" } end
    local done = stampede(list)
    for i, r in ipairs(done) do assert.are.equal(200, r.status, "request " .. i .. ": " .. tostring(r.body)) end
    -- (At the latest its TTL and half a second: the gate's own bound.)
    assert.is_true(core.now() - began < 1.5 * helpers.slow, "took " .. core.now() - began .. " s")
  end)

  it("never strands the lock when a worker is killed with its queue", function()
    local list = {}
    for i = 1, 60 do list[i] = { two_a.port, "/crowd?key=killed&wait=10&hold=0.02&ttl=1" } end
    local pending_ = {}
    for i, r in ipairs(list) do pending_[i] = http.start(r[1], "GET", r[2]) end
    assert.is_truthy(helpers.eventually(5, function() return #sections("killed") >= 5 end))
    local victim = sections("killed")[#sections("killed")].pid
    os.execute("kill -KILL " .. victim)
    local ok_count = 0
    for _, p in ipairs(pending_) do
      local ok, status = pcall(p.finish, p)
      if ok and status == 200 then ok_count = ok_count + 1 end
    end
    assert.is_true(ok_count > 0)
    -- The lock the killed worker held runs out by its TTL (1 s) at most.
    local began = core.now()
    local status, body = http.request(two_a.port, "GET", "/crowd?key=killed&wait=3")
    assert.are.equal(200, status, body)
    assert.is_true(core.now() - began < 1.5 * helpers.slow)
    -- ("inside:killed" may count the killed worker's section for ever: its
    -- sections are checked by their spans, which it never wrote.)
    assert(apart("killed"))
  end)

  it("lets another machine's waiter of a fair lock in while a worker's queue is long", function()
    local list = {}
    for i = 1, 80 do list[i] = { one.port, "/crowd?key=fair&wait=30&hold=0.02&fair=1" } end
    local pending_ = {}
    for i, r in ipairs(list) do pending_[i] = http.start(r[1], "GET", r[2]) end
    assert.is_truthy(helpers.eventually(5, function() return #sections("fair") >= 3 end))
    local other = redislock.new{ port = srv.port }
    local began = core.now()
    local lock = assert(other:acquire("fair", 5, { wait = 10, fair = true }))
    local waited, behind = core.now() - began, #sections("fair")
    assert(lock:release())
    for _, p in ipairs(pending_) do assert.are.equal(200, (p:finish())) end
    -- It queued behind the worker's one waiter on Redis, not its 80.
    assert.is_true(behind < 40, "it came in after " .. behind .. " of 80 sections (" .. waited .. " s)")
    other:close()
    -- Fair locks are not handed down: every section has a token of its own.
    local seen = {}
    for _, x in ipairs(sections("fair")) do
      assert.is_nil(seen[x.token])
      seen[x.token] = true
    end
  end)

  for _, kind in ipairs({ "sem", "read", "write" }) do
    it("coalesces the waiters of a " .. kind .. " hold too, exclusive and bounded", function()
      assert.are.equal("OK", raw:command("MSET", "readers", 0, "writers", 0))
      local list = {}
      for i = 1, 100 do list[i] = { two_a.port, "/primitive?kind=" .. kind .. "&limit=2&hold=0.003" } end
      local done, most, blocked = stampede(list)
      for i, r in ipairs(done) do
        assert.are.equal(200, r.status, "request " .. i .. ": " .. tostring(r.body) .. two_a:error_log())
      end
      assert.is_true(most <= POOL + WAITS, "connections of one worker: " .. most)
      assert.is_true(blocked <= 2, "blocked clients: " .. blocked)
      assert.are.equal(0, tonumber(raw:command("GET", "overlaps")) or 0)
      if kind == "sem" then
        for _, seen in ipairs(raw:command("LRANGE", "seen", 0, -1)) do assert.is_true(tonumber(seen) <= 2) end
      end
    end)
  end
end)
