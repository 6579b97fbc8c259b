-- SPDX-License-Identifier: MIT
-- The core's wire functions (script_call and command_call, the call state
-- machine the OpenResty transport drives over cosockets; encode, reader).
-- Here they talk to a real redis-server over a plain luasocket connection,
-- so that they also run under Lua 5.4, valgrind and ASan (nginx loads only
-- the LuaJIT build).
local core = require("redislock.core")
local helpers = require("spec.helpers")
local socket = require("socket")

describe("wire functions", function()
  local srv, raw, conn

  helpers.redis_for(function(s, r) srv, raw = s, r end, { flush = true })
  before_each(function()
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
  -- the connection stays in step, and call:result() as a list. run goes on
  -- from a step (and its bytes) the caller took.
  local function run(call, step, bytes)
    local sent = {}
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
  local function drive(call, reused) return run(call, call:start(reused or false)) end

  -- The server's clock (TIME) in ms.
  local function clock()
    local t = raw:command("TIME")
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end

  -- The name of the fence record of the slot of the lock on key.
  local function record(key) return "lock:{" .. core.era_tag(core.lock_slot(key)) .. "}:fences" end

  -- Asserts that result is an acquire's success, with a fence; returns it.
  local function granted(result)
    assert.are.equal(1, result[1])
    assert.are.equal("number", type(result[2]))
    assert.are.equal(math.floor(result[2]), result[2])
    return result[2]
  end

  -- Runs a lock script through a call: its status and value as a list.
  local function script(op, key, tok, ms)
    local _, _, result = drive(core.script_call(transport(), op, key, tok, ms))
    return result
  end

  it("drives the lock scripts through the core's call, fed byte by byte", function()
    local tok = core.token()
    local before = clock()
    local fence = granted(script("acquire", "k", tok, 5000))
    assert.is_true(fence >= helpers.id_fence(before), fence .. " below the clock's " .. helpers.id_fence(before))
    assert.are.equal(tostring(fence), raw:command("GET", "lock:{k}:fence"))
    assert.are.equal(tok, raw:command("GET", "lock:{k}"))
    local pttl = raw:command("PTTL", "lock:{k}")
    assert.is_true(pttl > 4000 and pttl <= 5000, tostring(pttl))
    local busy = script("acquire", "k", core.token(), 1000)
    assert.are.equal(-1, busy[1])
    assert.is_true(busy[2] > 4000 and busy[2] <= 5000, tostring(busy[2]))
    assert.are.equal(1, script("release", "k", tok)[1])
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}", "lock:{k}:fence"))
    assert.are.same({ 0, 0 }, script("pttl", "k", tok)) -- 0: no such lock
  end)

  it("takes with one transaction, no script (MULTI, SET NX PX, XADD of the slot's record, EXEC)", function()
    local tok = core.token()
    local rec = record("k")
    local function take(t, ms)
      return core.encode("MULTI") .. core.encode("SET", "lock:{k}", t, "NX", "PX", ms)
             .. core.encode("XADD", rec, "MAXLEN", 0, "*", "f", 1) .. core.encode("EXEC")
    end
    local before = clock()
    local sent, keep, result = drive(core.script_call(transport(), "take", "k", tok, 5000))
    local after = clock()
    local fence = granted(result)
    assert.are.same({ take(tok, 5000) }, sent) -- no INFO, no CLIENT, no script
    assert.is_true(keep)
    assert.is_true(fence >= helpers.id_fence(before) and fence < helpers.id_fence(after + 1),
                   fence .. " for clock " .. before)
    assert.are.equal(tok, raw:command("GET", "lock:{k}"))
    local pttl = raw:command("PTTL", "lock:{k}")
    assert.is_true(pttl > 4000 and pttl <= 5000, tostring(pttl))
    -- The fence is the record's new ID; a take keeps no holder's fence key.
    -- The record is a stream that keeps no entry, for good.
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}:fence"))
    assert.are.same({ rec, fence }, { helpers.fence_record(raw, "k") })
    assert.are.equal(0, raw:command("XLEN", rec))
    assert.are.equal(-1, raw:command("PTTL", rec))
    -- Held: the acquire script follows the take, tells the holder's TTL and
    -- sets the waiters mark. The take's XADD ran all the same: the record
    -- grew (fences grow by more than one now and then), the lock did not move.
    local other = core.token()
    sent, keep, result = drive(core.script_call(transport(), "take", "k", other, 1000))
    assert.are.equal(-1, result[1])
    assert.is_true(result[2] > 4000 and result[2] <= 5000, tostring(result[2]))
    assert.are.equal(2, #sent)
    assert.are.equal(take(other, 1000), sent[1])
    assert.are.equal(core.encode("EVALSHA", core.scripts.acquire.sha, 4, "lock:{k}", "lock:{k}:fence",
                                 "lock:{k}:waiters", rec, other, 1000), sent[2])
    assert.is_true(keep)
    assert.are.equal(tok, raw:command("GET", "lock:{k}"))
    assert.are.equal(1, raw:command("EXISTS", "lock:{k}:waiters"))
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}:fence"))
    local _, last = helpers.fence_record(raw, "k")
    assert.is_true(last > fence, last .. " > " .. fence)
    -- The next holder's fence is above every ID the record gave.
    assert.are.equal(1, script("release", "k", tok)[1])
    sent, _, result = drive(core.script_call(transport(), "take", "k", other, 1000))
    local next_fence = granted(result)
    assert.are.equal(1, #sent)
    assert.is_true(next_fence > last, next_fence .. " > " .. last)
    -- An error reply (here a lock key of another type, which SET NX finds
    -- there: the script follows, and its GET is refused) is the error.
    assert.are.equal(1, raw:command("HSET", "lock:{w}", "f", "v"))
    sent, _, result = drive(core.script_call(transport(), "take", "w", tok, 1000))
    assert.are.equal(2, #sent)
    assert.is_nil(result[1])
    assert.is_truthy(result[2]:match("^redis: WRONGTYPE"), result[2])
  end)

  it("makes a fence of the server's clock (ms since 2025 x 64), or one above the slot's record", function()
    -- An earlier version's era record of the slot ("<master ID> <offset>",
    -- a string, "...:era") and the counter it kept per name without a TTL:
    -- the take's fence is the clock's, from a record of its own name; the
    -- era record stays the earlier version's, the counter is left alone
    -- (a take keeps no holder's fence) and goes with the release.
    local rec, era = record("k"), "lock:{" .. core.era_tag(core.lock_slot("k")) .. "}:era"
    assert.are_not.equal(era, rec)
    assert.are.equal("OK", raw:command("SET", era, ("f"):rep(40) .. " 7000000000"))
    assert.are.equal("OK", raw:command("SET", "lock:{k}:fence", "7"))
    local tok = core.token()
    local before = clock()
    local sent, _, result = drive(core.script_call(transport(), "take", "k", tok, 5000))
    local after = clock()
    local fence = granted(result)
    assert.are.equal(1, #sent)
    assert.is_true(fence >= helpers.id_fence(before) and fence < helpers.id_fence(after + 1),
                   fence .. " for clock " .. before)
    assert.are.equal(tok, raw:command("GET", "lock:{k}"))
    assert.are.equal("stream", raw:command("TYPE", rec))
    assert.are.equal(fence, select(2, helpers.fence_record(raw, "k")))
    assert.are.equal(("f"):rep(40) .. " 7000000000", raw:command("GET", era))
    assert.are.equal("7", raw:command("GET", "lock:{k}:fence"))
    assert.are.equal(1, script("release", "k", tok)[1])
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}", "lock:{k}:fence"))
    -- The acquire script's fence too comes from the slot's record, and its
    -- grant writes the holder's fence with the lock's TTL (over a counter).
    assert.are.equal("OK", raw:command("SET", "lock:{k}:fence", "7"))
    fence = granted(script("acquire", "k", tok, 5000))
    assert.are.equal(fence, select(2, helpers.fence_record(raw, "k")))
    assert.are.equal(tostring(fence), raw:command("GET", "lock:{k}:fence"))
    local pttl = raw:command("PTTL", "lock:{k}:fence")
    assert.is_true(pttl > 4000 and pttl <= 5000, tostring(pttl))
    assert.are.equal(1, script("release", "k", tok)[1])
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}", "lock:{k}:fence"))
    -- A record ahead of this clock (raised by a clock ahead of it, or more
    -- than 64 fences in one ms): one above it, for any key of the slot,
    -- each from the take alone.
    local ms = clock() + 60000
    assert.are.equal(ms .. "-0", raw:command("XADD", rec, "MAXLEN", 0, ms .. "-0", "f", 1))
    sent, _, result = drive(core.script_call(transport(), "take", "k", tok, 5000))
    assert.are.equal(1, #sent)
    assert.are.equal(helpers.id_fence(ms, 1), granted(result))
    assert.are.equal(1, script("release", "k", tok)[1])
    assert.are.equal(helpers.id_fence(ms, 2),
                     granted(select(3, drive(core.script_call(transport(), "take", "k", tok, 5000)))))
    assert.are.equal(helpers.id_fence(ms, 2), select(2, helpers.fence_record(raw, "k")))
    assert.are.equal(1, script("release", "k", tok)[1])
    -- A record at seq 63: the take's ID ("<ms>-64") tells no fence; the
    -- script carries it into the next ms (an entry "<ms+1>-1" follows its
    -- own "<ms>-65"), and the next take goes on from there.
    assert.are.equal(ms .. "-63", raw:command("XADD", rec, "MAXLEN", 0, ms .. "-63", "f", 1))
    sent, _, result = drive(core.script_call(transport(), "take", "k", tok, 5000))
    assert.are.equal(2, #sent)
    assert.is_truthy(sent[2]:find("EVALSHA", 1, true))
    assert.are.equal(helpers.id_fence(ms + 1, 1), granted(result))
    assert.are.equal(helpers.id_fence(ms + 1, 1), select(2, helpers.fence_record(raw, "k")))
    assert.are.equal(tostring(helpers.id_fence(ms + 1, 1)), raw:command("GET", "lock:{k}:fence"))
    assert.are.equal(1, script("release", "k", tok)[1])
    sent, _, result = drive(core.script_call(transport(), "take", "k", tok, 5000))
    assert.are.equal(1, #sent)
    assert.are.equal(helpers.id_fence(ms + 1, 2), granted(result))
    -- The acquire script's fences come from the same record.
    assert.are.equal(1, script("release", "k", tok)[1])
    assert.are.equal(helpers.id_fence(ms + 1, 3), granted(script("acquire", "k", tok, 5000)))
    assert.are.equal(1, script("release", "k", tok)[1])
    -- A record that is no stream (another program's key of that name): the
    -- take's SET took the lock and its XADD was refused (WRONGTYPE); the
    -- script that follows is refused too, and the call gives the lock back
    -- itself (WATCH, GET, MULTI, DEL, EXEC), and says so.
    assert.are.equal(1, raw:command("DEL", rec))
    assert.are.equal("OK", raw:command("SET", rec, "x"))
    sent, _, result = drive(core.script_call(transport(), "take", "k", tok, 5000))
    assert.is_nil(result[1])
    assert.is_truthy(result[2]:match("^redis: WRONGTYPE.*; nothing its first try took is left$"), result[2])
    assert.are.equal(core.encode("WATCH", "lock:{k}") .. core.encode("GET", "lock:{k}"), sent[3])
    assert.are.equal(0, raw:command("EXISTS", "lock:{k}"))
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
    -- An acquire that may have landed goes again as the same script, which
    -- finds its own token.
    local step, call, bytes = lost("acquire", 1, false)
    assert.are.equal("reconnect", step)
    local again, abytes = call:start(0)
    assert.are.equal("send", again)
    assert.are.equal(bytes, abytes)
    assert.are.equal("failed", call:lost(false, "connection: lost again")) -- once only
    assert.are.same({ nil, "connection: lost again" }, { call:result() })
    -- A take that may have landed is followed by the acquire script, which
    -- finds its own token: never a take twice (a second SET NX would find
    -- our own lock held).
    assert.are.equal("failed", (lost("take", 0, false)))
    assert.are.equal("failed", (lost("take", 1, true)))
    step, call, bytes = lost("take", 1, false)
    assert.are.equal("reconnect", step)
    assert.are.equal(core.encode("MULTI"), bytes:sub(1, #core.encode("MULTI")))
    again, abytes = call:start(0)
    assert.are.equal("send", again)
    assert.are.equal(core.encode("EVALSHA", core.scripts.acquire.sha, 4, "lock:{k}", "lock:{k}:fence",
                                 "lock:{k}:waiters", record("k"), tok, 1000), abytes)
    assert.are.equal("failed", call:lost(false, "connection: lost again"))
  end)

  it("resends an acquire whose reply was lost, and answers a new fence, above the lost one", function()
    local tok = core.token()
    local call = core.script_call(transport(), "acquire", "k", tok, 5000)
    local step, bytes = call:start(1)
    assert.are.equal("send", step)
    assert(conn:send(bytes))
    -- It landed, and the connection died before its reply was read.
    assert(helpers.eventually(5, function() return raw:command("GET", "lock:{k}") == tok end), "never landed")
    local lost_fence = tonumber(raw:command("GET", "lock:{k}:fence"))
    assert.are.equal("reconnect", call:lost(false, "connection: lost"))
    conn:close()
    conn = assert(socket.connect("127.0.0.1", srv.port))
    conn:settimeout(5)
    local sent, keep, result = run(call, call:start(false))
    assert.are.same({ bytes }, sent)
    assert.is_true(keep)
    -- Nobody saw the lost fence: the resend's is the holder's, above it.
    local fence = granted(result)
    assert.is_true(fence > lost_fence, fence .. " > " .. lost_fence)
    assert.are.equal(tostring(fence), raw:command("GET", "lock:{k}:fence"))
    assert.are.equal(tok, raw:command("GET", "lock:{k}"))
    local pttl = raw:command("PTTL", "lock:{k}")
    assert.is_true(pttl > 4000 and pttl <= 5000, tostring(pttl))
  end)

  it("sends ASKING first when asked, then the acquire script, a take's too", function()
    local tok = core.token()
    local want = core.encode("ASKING") .. core.encode("EVALSHA", core.scripts.acquire.sha, 4, "lock:{k}",
                                                      "lock:{k}:fence", "lock:{k}:waiters", record("k"), tok, 1000)
    local take = core.script_call(transport(), "take", "k", tok, 1000)
    take:asking()
    assert.are.same({ "send", want }, { take:start(false) })
    local call = core.script_call(transport(), "acquire", "k", tok, 1000)
    call:asking()
    local step, bytes = call:start(false)
    assert.are.equal("send", step)
    assert.are.equal(want, bytes)
    -- Not a cluster: the server refuses ASKING, and that is the call's error.
    local _, _, result = drive(call)
    assert.is_nil(result[1])
    assert.is_truthy(result[2]:match("^redis: ASKING: ERR"), result[2])
  end)

  it("sends WAIT on the same connection after a script that answered 1, when asked", function()
    local call = core.script_call(transport(), "acquire", "k", core.token(), 5000)
    call:replicas(1, 50)
    local sent, keep, result = drive(call)
    granted(result)
    assert.are.equal(3, #result)
    assert.are.equal(0, result[3]) -- no replica acknowledged
    assert.are.equal(core.encode("WAIT", 1, 50), sent[2])
    assert.is_true(keep)
    call = core.script_call(transport(), "acquire", "k", core.token(), 5000)
    call:replicas(1, 50)
    sent, keep, result = drive(call)
    assert.are.equal(-1, result[1]) -- not ours: no WAIT
    assert.are.equal(1, #sent)
    assert.is_true(keep)
  end)

  it("has a fence record tag for every hash slot, of that slot, in four characters at most", function()
    for slot = 0, 16383 do
      local tag = core.era_tag(slot)
      assert(#tag >= 1 and #tag <= 4 and not tag:find("[{}]"), tag)
      assert(core.slot("{" .. tag .. "}:fences") == slot, tag)
    end
    assert.are.equal("0", core.era_tag(core.slot("0")))
  end)

  it("keeps its own copy of the token, which the caller may drop", function()
    local tok = core.token() .. ("z"):rep(60)
    local call = core.script_call(transport(), "acquire", "k", tok:sub(1), 5000)
    collectgarbage()
    collectgarbage()
    granted(select(3, drive(call)))
    assert.are.equal(tok, raw:command("GET", "lock:{k}"))
  end)

  it("sends EVAL after NOSCRIPT, once", function()
    assert.are.equal("OK", raw:command("SCRIPT", "FLUSH"))
    local tok = core.token()
    local sent, keep, result = drive(core.script_call(transport(), "acquire", "k", tok, 5000))
    granted(result)
    assert.are.equal(2, #sent)
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
