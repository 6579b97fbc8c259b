-- SPDX-License-Identifier: MIT
-- The read-write lock (redislock/rwlock.lua) against a real server, with OS
-- processes: readers overlap, writers overlap nothing; a writer gets in
-- within a bounded time while readers keep coming; a killed reader's hold
-- runs out by its TTL; a writer that gives up lets readers in at once;
-- renewal, with_read/with_write's guarantees, bad arguments. Under OpenResty:
-- spec/50.
local core = require("redislock.core")
local helpers = require("spec.helpers")

describe("read-write lock", function()
  local srv, raw, client

  helpers.client_for(function(s, r, c) srv, raw, client = s, r, c end)
  before_each(function() raw:command("MSET", "readers", 0, "writers", 0) end)

  local function spawn_all(list, start_at)
    local procs = {}
    for i, a in ipairs(list) do
      procs[i] = helpers.spawn_primitive(srv.port, a[1], start_at or core.now() + 0.5 * helpers.slow,
                               table.unpack(a, 2))
    end
    return procs
  end

  it("lets readers overlap and writers overlap nothing (4 reader and 2 writer processes)", function()
    local list = {}
    for i = 1, 4 do list[i] = { "read", 15, 0.01 } end
    list[5], list[6] = { "write", 10, 0.005 }, { "write", 10, 0.005 }
    assert.are.equal(0, helpers.overlaps(spawn_all(list)))
    local most = 0
    for _, n in ipairs(raw:command("LRANGE", "readers_seen", 0, -1)) do most = math.max(most, tonumber(n)) end
    assert.is_true(most >= 2, "readers never overlapped (at most " .. most .. ")")
    local fences = raw:command("LRANGE", "wfences", 0, -1)
    assert.are.equal(20, #fences)
    for i = 2, #fences do assert.is_true(tonumber(fences[i]) > tonumber(fences[i - 1])) end
    assert.are.equal(0, raw:command("EXISTS", "lock:{doc}:rw:readers", "lock:{doc}:rw:writer"))
  end)

  it("gets a writer in within a bounded time while readers keep coming", function()
    -- Four processes take overlapping read holds back to back for 4 s: the
    -- lock is never free of readers. A writer waits; new readers queue
    -- behind it, and it gets in once the holds in progress end.
    local procs = spawn_all({ { "stream", 4, 0.2 }, { "stream", 4, 0.2 }, { "stream", 4, 0.2 },
                              { "stream", 4, 0.2 } }, core.now())
    assert.is_truthy(helpers.eventually(5, function()
      return tonumber(raw:command("ZCARD", "lock:{doc}:rw:readers")) >= 2
    end))
    core.sleep(0.5)
    local rw = client:rwlock("doc")
    local t0 = core.now()
    local w = assert(rw:write(5, { wait = 3 }))
    local waited = core.now() - t0
    assert.is_true(waited < 1 * helpers.slow, "the writer waited " .. waited .. " s")
    assert.are.equal(0, raw:command("ZCOUNT", "lock:{doc}:rw:readers", "(" .. raw:command("TIME")[1] * 1000, "+inf"))
    core.sleep(0.3)
    assert.is_true(w:release())
    helpers.overlaps(procs)
  end)

  it("keeps new readers out once a writer waits, and lets them in when it gives up", function()
    local rw = client:rwlock("doc")
    local r1 = assert(rw:read(10))
    local writer = helpers.spawn_primitive(srv.port, "write", core.now(), 1, 0.01)
    assert.is_truthy(helpers.eventually(5, function()
      return raw:command("ZCARD", "lock:{doc}:rw:writers") == 1
    end), "the writer never queued")
    local _, err = rw:read(5)
    assert.matches('^busy: read%-write lock "doc" is held or awaited by a writer %(read; ', err)
    assert.is_true(r1:release()) -- the writer gets in
    local out, ok = writer.wait()
    assert.is_true(ok, out)
    -- A writer that gives up leaves the queue: readers get in at once.
    local r2 = assert(rw:read(10))
    local _, werr = rw:write(5, { wait = 0.2 })
    assert.matches('^busy: read%-write lock "doc" is still held by a writer or readers after waiting 0%.2 s %(write; ',
                   werr)
    assert.are.equal(0, raw:command("EXISTS", "lock:{doc}:rw:writers"))
    local r3 = assert(rw:read(10))
    assert(r2:release()); assert(r3:release())
  end)

  it("runs a SIGKILLed reader's hold out by its TTL", function()
    helpers.killed_holder(srv, raw, "the reader")
    local rw = client:rwlock("doc")
    assert.is_nil(rw:write(5))
    local t0 = core.now()
    local w = assert(rw:write(5, { wait = 3 }))
    assert.is_true(core.now() - t0 < 1.5 * helpers.slow)
    assert(w:release())
  end)

  it("renews read and write holds, and reports a lost one", function()
    local rw = client:rwlock("doc")
    local r = assert(rw:read(0.3, { renew = true }))
    core.sleep(0.9)
    assert.is_true(r:check(true))
    assert.is_true(r:release())
    local w = assert(rw:write(0.3, { renew = true }))
    core.sleep(0.9)
    assert.is_true(w:check(true))
    local left = assert(w:ttl())
    assert.is_true(left > 0 and left <= 0.3)
    raw:command("DEL", "lock:{doc}:rw:writer")
    local ok, err = w:release()
    assert.is_nil(ok)
    assert.matches('^lost: the write lock on "doc" is no longer ours', err)
  end)

  it("with_read and with_write return fn's values, re-raise its error unchanged, and raise lost", function()
    local rw = client:rwlock("doc")
    local fence
    local got = rw:with_read(5, function(h)
      assert.are.equal(1, raw:command("ZCARD", "lock:{doc}:rw:readers"))
      fence = h.fence
      return h.fence + 2
    end)
    assert.are.equal(fence + 2, got)
    local value = setmetatable({}, { __tostring = function() return "mine" end })
    local ok, err = pcall(rw.with_write, rw, 5, function() error(value) end)
    assert.is_false(ok)
    assert.are.equal(value, err)
    assert.are.equal(0, raw:command("EXISTS", "lock:{doc}:rw:writer"))
    ok, err = pcall(rw.with_read, rw, 5, function() raw:command("DEL", "lock:{doc}:rw:readers") end)
    assert.is_false(ok)
    assert.matches('^lost: the read lock on "doc" is no longer ours', err)
    -- A write waits for a reader, and the reader's release wakes it.
    local r = assert(rw:read(5))
    local writer = helpers.spawn_primitive(srv.port, "write", core.now(), 1, 0.01)
    assert.is_truthy(helpers.eventually(5, function()
      return raw:command("ZCARD", "lock:{doc}:rw:writers") == 1
    end))
    local t0 = core.now()
    assert(r:release())
    local out, wok = writer.wait()
    assert.is_true(wok, out)
    assert.is_true(core.now() - t0 < 0.5 * helpers.slow, "the writer was not woken by the release")
  end)

  it("raises on bad arguments", function()
    assert.has_error(function() client:rwlock("") end, "bad argument #1 to 'rwlock' (key must not be empty)")
    assert.has_error(function() client:rwlock({}) end)
    assert.has_error(function() client:rwlock("doc", 1) end)
    local rw = client:rwlock("doc")
    assert.has_error(function() rw:read() end)
    assert.has_error(function() rw:write(-1) end)
    assert.has_error(function() rw:read(5, { fair = true }) end)
    assert.has_error(function() rw:write(5, { wait = "x" }) end)
    assert.has_error(function() rw:with_read(5) end, "bad argument #2 to 'with_read' (function expected, got nil)")
    assert.has_error(function() rw.with_write(5, function() end) end)
    assert.has_error(function() rw:read(5, nil, 1) end)
  end)
end)
