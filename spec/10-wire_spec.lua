-- SPDX-License-Identifier: MIT
-- The core's wire functions (script_call and command_call, the call state
-- machine the OpenResty transport drives over cosockets; encode, reader).
-- Here they talk to a real redis-server over a plain luasocket connection,
-- so that they also run under Lua 5.4, valgrind and ASan (nginx loads only
-- the LuaJIT build).
local core = require "redislock.core"
local helpers = require "spec.helpers"
local socket = require "socket"

describe("wire functions", function()
  local srv, raw, conn

  helpers.redis_for(lazy_setup, lazy_teardown, function(s, r) srv, raw = s, r end)
  before_each(function()
    assert.are.equal("OK", raw:command("FLUSHALL"))
    conn = assert(socket.connect("127.0.0.1", srv.port))
    conn:settimeout(5)
  end)
  after_each(function() conn:close() end)

  -- Sends bytes, then feeds the reader one byte at a time (the hardest split)
  -- until reader:reply() has a reply; checks it had none before.
  local function round_trip(bytes)
    assert(conn:send(bytes))
    local reader = core.reader()
    while true do
      local a, b = reader:reply()
      if a ~= nil or b ~= nil then return a, b end
      reader:feed(assert(conn:receive(1)))
    end
  end

  -- What the transport looks like to core.script_call and core.command_call.
  local function transport() return { prefix = "lock:", where = "127.0.0.1:" .. srv.port, timeout_ms = 5000 } end

  -- Drives call as the OpenResty transport does (redislock/ngx.lua), over
  -- the luasocket connection, fed one byte at a time; reused: whether the
  -- connection served before. Returns what the call sent (a list), whether
  -- the connection stays in step, and call:result() as a list.
  local function drive(call, reused)
    local sent, step, bytes = {}, call:start(reused or false)
    while true do
      if step == "send" then
        sent[#sent + 1] = bytes
        assert(conn:send(bytes))
        step = "read"
      elseif step == "read" then
        step, bytes = call:feed(assert(conn:receive(1)))
      elseif step == "reconnect" then
        conn:close()
        conn = assert(socket.connect("127.0.0.1", srv.port))
        conn:settimeout(5)
        step, bytes = call:start(false)
      else
        return sent, call:keep(), { call:result() }
      end
    end
  end

  -- Runs a lock script through a call: its status and value as a list.
  local function script(op, key, tok, ms)
    local _, _, result = drive(core.script_call(transport(), op, key, tok, ms))
    return result
  end

  it("drives the lock scripts through the core's call, fed byte by byte", function()
    local tok = core.token()
    assert.are.same({ 1, 1 }, script("acquire", "k", tok, 5000))
    assert.are.equal(tok, raw:command("GET", "lock:{k}"))
    local pttl = raw:command("PTTL", "lock:{k}")
    assert.is_true(pttl > 4000 and pttl <= 5000, tostring(pttl))
    local busy = script("acquire", "k", core.token(), 1000)
    assert.are.equal(-1, busy[1])
    assert.is_true(busy[2] > 4000 and busy[2] <= 5000, tostring(busy[2]))
    assert.are.equal(1, script("release", "k", tok)[1])
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}"))
    assert.are.same({ 0, 0 }, script("pttl", "k", tok)) -- 0: no such lock
  end)

  it("takes (MULTI, SET, INCR, GET era, CLIENT GETNAME, EXEC), names the connection after its master", function()
    local tok = core.token()
    local era = "lock:{" .. core.era_tag(core.lock_slot("k")) .. "}:era"
    local take = core.encode("MULTI") .. core.encode("SET", "lock:{k}", tok, "NX", "PX", 5000)
                 .. core.encode("INCR", "lock:{k}:fence") .. core.encode("GET", era)
                 .. core.encode("CLIENT", "GETNAME") .. core.encode("EXEC")
    local function take_call() return core.script_call(transport(), "take", "k", tok, 5000) end
    -- No era record yet: taken, then the acquire script tells the fence
    -- (it writes the record: this server was never a replica, offset 0).
    local sent, keep, result = drive(take_call())
    assert.are.same({ 1, 1 }, result)
    assert.are.equal(take, sent[1])
    assert.is_truthy(sent[2]:find("EVALSHA", 1, true))
    assert.are.equal(2, #sent)
    assert.is_true(keep)
    local id = raw:command("INFO", "replication"):match("master_replid:(%x+)")
    assert.are.equal(id .. " 0", raw:command("GET", era))
    -- The record named no master: nothing was claimed, the connection is unnamed.
    assert.is_false(round_trip(core.encode("CLIENT", "GETNAME")))
    assert.are.equal(1, script("release", "k", tok)[1])
    -- Now the record names this master: the script confirms the claim, after
    -- CLIENT SETNAME in the same write; the next take needs no script.
    sent, keep, result = drive(take_call())
    assert.are.same({ 1, 2 }, result)
    assert.is_true(keep)
    local name = core.encode("CLIENT", "SETNAME", "redislock:" .. id)
    assert.are.equal(name, sent[2]:sub(1, #name))
    assert.are.equal("redislock:" .. id, round_trip(core.encode("CLIENT", "GETNAME")))
    assert.are.equal(1, script("release", "k", tok)[1])
    sent, keep, result = drive(take_call())
    assert.are.same({ 1, 3 }, result)
    assert.are.equal(1, #sent)
    assert.is_true(keep)
    -- Held: the acquire script follows and tells its TTL; the counter
    -- counted the try (fences only grow, by more than one at times).
    local busy = script("take", "k", core.token(), 1000)
    assert.are.equal(-1, busy[1])
    assert.is_true(busy[2] > 4000 and busy[2] <= 5000, tostring(busy[2]))
    assert.are.equal("4", raw:command("GET", "lock:{k}:fence"))
    -- The record's offset is added.
    assert.are.equal(1, script("release", "k", tok)[1])
    assert.are.equal("OK", raw:command("SET", era, id .. " 7000000000"))
    assert.are.same({ 1, 7000000005 }, select(3, drive(take_call())))
    assert.are.equal(1, script("release", "k", tok)[1])
    -- A record another master wrote: the claim fails, the script starts a
    -- new era, and the name goes (CLIENT SETNAME "" after the script).
    assert.are.equal("OK", raw:command("SET", era, ("f"):rep(40) .. " 7000000000"))
    sent, keep, result = drive(take_call())
    assert.are.equal(1, result[1])
    assert.is_true(result[2] > 7000000005, tostring(result[2]))
    assert.are.equal(core.encode("CLIENT", "SETNAME", ""), sent[3])
    assert.is_true(keep)
    assert.is_false(round_trip(core.encode("CLIENT", "GETNAME")))
    -- An error reply (here a fence counter that is not a number) is the error.
    assert.are.equal("OK", raw:command("SET", "lock:{w}:fence", "x"))
    assert.are.same({ nil, "redis: ERR value is not an integer or out of range" },
                    script("take", "w", tok, 1000))
  end)

  it("resends once on a reused connection lost while idle, never a release, never after a timeout", function()
    local t, tok = transport(), core.token()
    local function lost(op, reused, timed_out)
      local call = core.script_call(t, op, "k", tok, 1000)
      local step, bytes = call:start(reused)
      assert.are.equal("send", step)
      return call:lost(timed_out, "connection: lost"), call, bytes
    end
    assert.are.equal("reconnect", (lost("acquire", 1, false)))
    assert.are.equal("failed", (lost("acquire", 0, false))) -- a fresh connection: the server's doing
    assert.are.equal("failed", (lost("acquire", 1, true)))
    assert.are.equal("failed", (lost("release", 1, false)))
    assert.are.equal("reconnect", (lost("extend", 1, false)))
    -- A take may have landed: the acquire script follows, which reconciles.
    local step, call, bytes = lost("take", 1, false)
    assert.are.equal("reconnect", step)
    assert.is_truthy(bytes:find("MULTI", 1, true))
    local again, abytes = call:start(0)
    assert.are.equal("send", again)
    assert.is_truthy(abytes:find("EVALSHA", 1, true))
    assert.are.equal("failed", call:lost(false, "connection: lost again")) -- once only
    assert.are.same({ nil, "connection: lost again" }, { call:result() })
  end)

  it("sends ASKING first when asked, and a take as the acquire script then", function()
    local call = core.script_call(transport(), "take", "k", core.token(), 1000)
    call:asking()
    local step, bytes = call:start(false)
    assert.are.equal("send", step)
    assert.are.equal(core.encode("ASKING"), bytes:sub(1, #core.encode("ASKING")))
    assert.is_truthy(bytes:find("EVALSHA", 1, true))
    -- Not a cluster: the server refuses ASKING, and that is the call's error.
    local _, _, result = drive(call)
    assert.is_nil(result[1])
    assert.is_truthy(result[2]:match("^redis: ASKING: ERR"), result[2])
  end)

  it("sends WAIT on the same connection after a script that answered 1, when asked", function()
    local call = core.script_call(transport(), "acquire", "k", core.token(), 5000)
    call:replicas(1, 50)
    local sent, keep, result = drive(call)
    assert.are.same({ 1, 1, 0 }, result) -- no replica acknowledged
    assert.are.equal(core.encode("WAIT", 1, 50), sent[2])
    assert.is_true(keep)
    call = core.script_call(transport(), "acquire", "k", core.token(), 5000)
    call:replicas(1, 50)
    sent, keep, result = drive(call)
    assert.are.equal(-1, result[1]) -- not ours: no WAIT
    assert.are.equal(1, #sent)
    assert.is_true(keep)
  end)

  it("starts a new era at the master's clock, so two masters starting from one record differ", function()
    -- make torture's case: a record another master wrote ("f..f 5000"), from
    -- which two masters start their eras, one after the other. A fixed jump
    -- gave both the same offset, and so the same fences.
    local era = "lock:{" .. core.era_tag(core.lock_slot("k")) .. "}:era"
    local id = raw:command("INFO", "replication"):match("master_replid:(%x+)")
    local function new_era()
      assert.are.equal("OK", raw:command("SET", era, ("f"):rep(40) .. " 5000"))
      assert.are.equal("OK", raw:command("SET", "lock:{k}:fence", "7"))
      local tok = core.token()
      local fence = script("acquire", "k", tok, 5000)[2]
      assert.are.equal(1, script("release", "k", tok)[1])
      local off = tonumber(raw:command("GET", era):match("^" .. id .. " (%d+)$"))
      assert.are.equal(off + 8, fence)
      return off
    end
    local t = raw:command("TIME")
    local first = new_era()
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    assert.is_true(first >= now and first < now + 5000, "offset " .. first .. ", clock " .. now)
    core.sleep(0.01)
    assert.is_true(new_era() >= first + 10)
    -- A clock behind the record's offset: the old offset plus 1,000.
    assert.are.equal("OK", raw:command("SET", era, ("f"):rep(40) .. " 99999999999999"))
    local tok = core.token()
    assert.are.equal(99999999999999 + 1000 + 9, script("acquire", "k", tok, 5000)[2])
  end)

  it("starts a promoted replica's era 5 s ahead, above a master restarted meanwhile", function()
    -- make torture's case: a master killed and restarted at once came back
    -- as a master (a new replication ID, master_replid2 unset: this
    -- section's own server stands in for it) and started its era 250 ms
    -- after the replica promoted in its place; the replica, the master that
    -- stayed, then handed out fences below the ones the restarted master
    -- had handed out to clients the sentinels still sent to it.
    local redislock = require "redislock"
    local primary = helpers.start_redis()
    local replica = helpers.start_redis({ "--replicaof", "127.0.0.1", tostring(primary.port) })
    finally(function()
      replica:stop()
      primary:stop()
    end)
    assert(helpers.eventually(10, function()
      return replica:cli("INFO", "replication"):find("master_link_status:up", 1, true) ~= nil
    end), "the replica never synced")
    assert.are.equal("OK", replica:cli("REPLICAOF", "NO", "ONE"))
    local era = "lock:{" .. core.era_tag(core.lock_slot("k")) .. "}:era"
    local record = ("f"):rep(40) .. " 5000" -- the old master's
    local function clock(server)
      local t = server:cli("TIME")
      local sec, usec = t:match("^(%d+)\n(%d+)$")
      return tonumber(sec) * 1000 + math.floor(tonumber(usec) / 1000)
    end
    -- The replica promoted first: its era 5 s ahead of its clock.
    assert.are.equal("OK", replica:cli("SET", era, record))
    local before = clock(replica)
    local c = redislock.new({ port = replica.port })
    local lock = assert(c:acquire("k", 5))
    local promoted = tonumber(replica:cli("GET", era):match(" (%d+)$"))
    assert.is_true(promoted >= before + 5000 and promoted < before + 10000,
                   "offset " .. promoted .. ", clock " .. before)
    assert.are.equal(promoted + 1, lock.fence)
    assert(lock:release())
    c:close()
    -- The master restarted after it: its era at its clock, below.
    core.sleep(0.3)
    assert.are.equal("OK", raw:command("SET", era, record))
    local tok = core.token()
    local fence = script("acquire", "k", tok, 5000)[2]
    local restarted = tonumber(raw:command("GET", era):match(" (%d+)$"))
    assert.is_true(restarted >= before + 300 and restarted < promoted, "offset " .. restarted)
    assert.are.equal(restarted + 1, fence)
  end)

  it("has an era tag for every hash slot, of that slot, in four characters at most", function()
    for slot = 0, 16383 do
      local tag = core.era_tag(slot)
      assert(#tag >= 1 and #tag <= 4 and not tag:find("[{}]"), tag)
      assert(core.slot("{" .. tag .. "}:era") == slot, tag)
    end
    assert.are.equal("0", core.era_tag(core.slot("0")))
  end)

  it("keeps its own copy of the token, which the caller may drop", function()
    local tok = core.token() .. ("z"):rep(60)
    local call = core.script_call(transport(), "acquire", "k", tok:sub(1), 5000)
    collectgarbage()
    collectgarbage()
    assert.are.same({ 1, 1 }, select(3, drive(call)))
    assert.are.equal(tok, raw:command("GET", "lock:{k}"))
  end)

  it("sends EVAL after NOSCRIPT, once", function()
    assert.are.equal("OK", raw:command("SCRIPT", "FLUSH"))
    local tok = core.token()
    local sent, keep, result = drive(core.script_call(transport(), "acquire", "k", tok, 5000))
    assert.are.same({ 1, 1 }, result)
    assert.is_truthy(sent[1]:find("EVALSHA", 1, true))
    assert.is_truthy(sent[2]:find("EVAL", 1, true) and not sent[2]:find("EVALSHA", 1, true))
    assert.is_true(keep)
    assert.are.equal(tok, raw:command("GET", "lock:{k}"))
  end)

  it("encodes any bytes and decodes every reply type", function()
    local bin = "a\0b\r\n\255"
    local sent, keep, result = drive(core.command_call(transport(), core.encode("SET", "bin", bin)))
    assert.are.same({ "OK" }, result)
    assert.are.equal(core.encode("SET", "bin", bin), sent[1])
    assert.is_true(keep)
    assert.are.equal(bin, round_trip(core.encode("GET", "bin")))
    assert.is_false(round_trip(core.encode("GET", "missing")))
    assert.are.equal(3, round_trip(core.encode("RPUSH", "list", "x", 2, 3.5)))
    assert.are.same({ "x", "2", "3.5" }, round_trip(core.encode("LRANGE", "list", 0, -1)))
    local none, err = round_trip(core.encode("NOSUCHCOMMAND"))
    assert.is_nil(none)
    assert.is_truthy(err:match("^redis: ERR unknown command"), err)
    result = select(3, drive(core.command_call(transport(), core.encode("NOSUCHCOMMAND"))))
    assert.is_nil(result[1])
    assert.is_truthy(result[2]:match("^redis: ERR unknown command"), result[2])
  end)

  it("writes RESP arrays of bulk strings exactly (empty, binary, 10+ and long arguments)", function()
    assert.are.equal("*1\r\n$4\r\nPING\r\n", core.encode("PING"))
    assert.are.equal("*3\r\n$3\r\nSET\r\n$0\r\n\r\n$5\r\na\r\n\0b\r\n", core.encode("SET", "", "a\r\n\0b"))
    local args, want = {}, { "*12\r\n" }
    for i = 1, 12 do
      args[i] = string.rep("x", i * 250) -- past the 1 KiB stack buffer from the fifth on
      want[#want + 1] = "$" .. #args[i] .. "\r\n" .. args[i] .. "\r\n"
    end
    local unpack = table.unpack or unpack -- luacheck: ignore (LuaJIT's global)
    assert.are.equal(table.concat(want), core.encode(unpack(args)))
    assert.are.equal(11, round_trip(core.encode("RPUSH", "long", unpack(args, 2))))
  end)

  it("reports bytes that are not RESP, and a reply nested too deeply, without crashing", function()
    local reader = core.reader()
    reader:feed("?what\r\n")
    local none, err, unreadable = reader:reply()
    assert.is_nil(none)
    assert.is_true(unreadable)
    assert.is_truthy(err:match("^connection: the server's reply is not RESP %(Protocol error"), err)
    -- hiredis reads arrays nested 8 deep, and refuses a ninth level.
    reader = core.reader()
    reader:feed(("*1\r\n"):rep(8) .. ":1\r\n")
    assert.are.same({ { { { { { { { 1 } } } } } } } }, reader:reply())
    reader = core.reader()
    reader:feed(("*1\r\n"):rep(9) .. ":1\r\n")
    none, err, unreadable = reader:reply()
    assert.is_nil(none)
    assert.is_true(unreadable)
    assert.is_truthy(err:match("^redis: the reply nests arrays deeper than hiredis 0%.14 can read"), err)
  end)

  it("checks its arguments", function()
    local function raises(msg, f, ...)
      local ok, err = pcall(f, ...)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(msg, 1, true), err)
    end
    raises("command name expected", core.encode)
    raises("string or number expected, got table", core.encode, "SET", {})
    local t = { prefix = "p:" }
    raises("invalid option 'drop'", core.script_call, t, "drop", "k", "t", 1)
    raises("key must not be empty", core.script_call, t, "acquire", "", "t", 1)
    raises("token must not be empty", core.script_call, t, "acquire", "k", "", 1)
    raises("ttl must be an integer number of milliseconds >= 1", core.script_call, t, "extend", "k", "t", 0)
    raises("limit must be an integer >= 1", core.script_call, t, "sem_acquire", "k", "t", 1000, 0)
    raises("prefix must not contain '{' or '}'", core.script_call, { prefix = "p{" }, "release", "k", "t")
    raises("table expected, got nil", core.script_call, nil, "release", "k", "t")
    raises("string expected", core.command_call, t)
    local call = core.script_call(t, "acquire", "k", "t", 1000)
    raises("replicas must be an integer >= 1", call.replicas, call, 0, 10)
    raises("replica_ms must be an integer number of milliseconds >= 1", call.replicas, call, 1, 0.5)
    call:close()
    call:close() -- twice is harmless
    assert.are.equal("redislock.Call (closed)", tostring(call))
    raises("call is closed", call.start, call, false)
    raises("wait must be an integer number of milliseconds >= 1", core.encode_wait, "k", nil, 0, "p:")
    local reader = core.reader()
    raises("string expected, got nil", reader.feed, reader, nil)
    reader:feed("?bad\r\n")
    assert.is_nil((reader:reply()))
    raises("the reader failed (Protocol error", reader.feed, reader, "+OK\r\n")
    reader:close()
    reader:close() -- twice is harmless
    assert.are.equal("redislock.Reader (closed)", tostring(reader))
    raises("reader is closed", reader.reply, reader)
  end)
end)
