-- SPDX-License-Identifier: MIT
-- The core's wire functions (encode_script, encode, reader), which the
-- OpenResty transport sends over cosockets. Here they talk to a real
-- redis-server over a plain luasocket connection, so that they also run under
-- Lua 5.4, valgrind and ASan (nginx loads only the LuaJIT build).
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
  -- until reader[method] has a reply; checks it had none before.
  local function round_trip(bytes, method)
    assert(conn:send(bytes))
    local reader = core.reader()
    while true do
      local a, b = reader[method](reader)
      if a ~= nil or b ~= nil then return a, b end
      reader:feed(assert(conn:receive(1)))
    end
  end

  -- Runs a lock script as the OpenResty transport does: EVALSHA, then EVAL
  -- after NOSCRIPT. Returns its status and value as a list.
  local function script(op, key, tok, ms)
    local status, value = round_trip(core.encode_script(op, key, tok, ms, "lock:"), "script_reply")
    if status == false then
      status, value = round_trip(core.encode_script(op, key, tok, ms, "lock:", true), "script_reply")
    end
    return { status, value }
  end

  it("encodes the lock scripts and decodes their replies, fed byte by byte", function()
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
    assert.are.equal(0, script("pttl", "k", tok)[1]) -- 0: no such lock
  end)

  it("encodes a take (MULTI, SET, INCR, GET era[, CLIENT GETNAME], EXEC), decodes it fed byte by byte", function()
    local tok = core.token()
    local era = "lock:{" .. core.era_tag(core.lock_slot("k")) .. "}:era"
    local head = core.encode("MULTI") .. core.encode("SET", "lock:{k}", tok, "NX", "PX", 5000)
                 .. core.encode("INCR", "lock:{k}:fence") .. core.encode("GET", era)
    -- A client's take: its connection vouches for the era record.
    assert.are.equal(head .. core.encode("EXEC"), core.encode_script("take", "k", tok, 5000, "lock:"))
    -- A pool's (OpenResty's): the connection's name vouches for it.
    local bytes = core.encode_script("take", "k", tok, 5000, "lock:", false, nil, nil, true)
    assert.are.equal(head .. core.encode("CLIENT", "GETNAME") .. core.encode("EXEC"), bytes)
    -- No era record yet: taken, but the fence is the acquire script's to
    -- tell (2, and the master the record names: none). The script writes
    -- the record: this server was never a replica, so its offset is 0.
    assert.are.same({ 2, "" }, { round_trip(bytes, "take_reply") })
    assert.are.equal(tok, raw:command("GET", "lock:{k}"))
    local pttl = raw:command("PTTL", "lock:{k}")
    assert.is_true(pttl > 4000 and pttl <= 5000, tostring(pttl))
    assert.are.same({ 1, 1 }, script("acquire", "k", tok, 5000))
    local id = raw:command("INFO", "replication"):match("master_replid:(%x+)")
    assert.are.equal(id .. " 0", raw:command("GET", era))
    -- Still unnamed: 2 and that master; named after it, the take tells the fence.
    assert.are.equal(1, script("release", "k", tok)[1])
    assert.are.same({ 2, id }, { round_trip(bytes, "take_reply") })
    assert.are.equal(1, script("release", "k", tok)[1])
    assert.are.equal("OK", round_trip(core.setname(id), "reply"))
    assert.are.same({ 1, 3 }, { round_trip(bytes, "take_reply") })
    -- Held: -1 and -3 (its TTL unknown; the acquire script tells it), and the
    -- counter counted the try: fences only grow, by more than one at times.
    assert.are.same({ -1, -3 }, { round_trip(core.encode_script("take", "k", core.token(), 1000, "lock:", false, nil,
                                                                 nil, true), "take_reply") })
    assert.are.equal(tok, raw:command("GET", "lock:{k}"))
    assert.are.equal("4", raw:command("GET", "lock:{k}:fence"))
    -- The record's offset is added (a record another master wrote: 2 again).
    assert.are.equal(1, script("release", "k", tok)[1])
    assert.are.equal("OK", raw:command("SET", era, id .. " 7000000000"))
    assert.are.same({ 1, 7000000005 }, { round_trip(bytes, "take_reply") })
    assert.are.equal(1, script("release", "k", tok)[1])
    assert.are.equal("OK", raw:command("SET", era, ("f"):rep(40) .. " 7000000000"))
    assert.are.same({ 2, ("f"):rep(40) }, { round_trip(bytes, "take_reply") })
    -- An error reply (here a fence counter that is not a number) is the error.
    assert.are.equal("OK", raw:command("SET", "lock:{w}:fence", "x"))
    local none, err = round_trip(core.encode_script("take", "w", tok, 1000, "lock:", false, nil, nil, true),
                                 "take_reply")
    assert.is_nil(none)
    assert.are.equal("redis: ERR value is not an integer or out of range", err)
    -- With eval: the acquire script, which a take falls back on.
    assert.are.equal(core.encode_script("acquire", "k", tok, 5000, "lock:", true),
                     core.encode_script("take", "k", tok, 5000, "lock:", true))
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

  it("says NOSCRIPT as false, and EVAL then works", function()
    assert.are.equal("OK", raw:command("SCRIPT", "FLUSH"))
    local tok = core.token()
    local status, err = round_trip(core.encode_script("acquire", "k", tok, 5000, "p:"), "script_reply")
    assert.is_false(status)
    assert.are.equal("redis: NOSCRIPT", err)
    assert.are.same({ 1, 1 }, { round_trip(core.encode_script("acquire", "k", tok, 5000, "p:", true),
                                           "script_reply") })
    assert.are.equal(tok, raw:command("GET", "p:{k}"))
  end)

  it("encodes any bytes and decodes every reply type", function()
    local bin = "a\0b\r\n\255"
    assert.are.equal("OK", round_trip(core.encode("SET", "bin", bin), "reply"))
    assert.are.equal(bin, round_trip(core.encode("GET", "bin"), "reply"))
    assert.is_false(round_trip(core.encode("GET", "missing"), "reply"))
    assert.are.equal(3, round_trip(core.encode("RPUSH", "list", "x", 2, 3.5), "reply"))
    assert.are.same({ "x", "2", "3.5" }, round_trip(core.encode("LRANGE", "list", 0, -1), "reply"))
    local none, err = round_trip(core.encode("NOSUCHCOMMAND"), "reply")
    assert.is_nil(none)
    assert.is_truthy(err:match("^redis: ERR unknown command"), err)
    local _, serr = round_trip(core.encode("PING"), "script_reply")
    assert.are.equal("redis: unexpected reply to a redislock script", serr)
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
    assert.are.equal(11, round_trip(core.encode("RPUSH", "long", unpack(args, 2)), "reply"))
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
    raises("invalid option 'drop'", core.encode_script, "drop", "k", "t", 1, "p:")
    raises("key must not be empty", core.encode_script, "acquire", "", "t", 1, "p:")
    raises("token must not be empty", core.encode_script, "acquire", "k", "", 1, "p:")
    raises("ttl must be an integer number of milliseconds >= 1", core.encode_script, "extend", "k", "t", 0, "p:")
    raises("prefix must not contain '{' or '}'", core.encode_script, "release", "k", "t", nil, "p{")
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
