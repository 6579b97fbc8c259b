-- SPDX-License-Identifier: MIT
-- A client process of bench/split.lua (a benchmark, not a test): N
-- uncontended cycles against 127.0.0.1:PORT, timed after WARM (200) of
-- them; prints cycles_per_s=<rate> warm=<WARM>.
--   <lua> bench/split_client.lua PORT N lib KEY
--     redislock's acquire+release of KEY (TTL 10 s), as bench/cycle.lua's;
--   <lua> bench/split_client.lua PORT N core KEY
--     the same through the C core's calls alone (core.fast_take, and
--     core.fast_release on a lock table of this loop's): what the Lua layer
--     (Client:acquire, the lock object, Lock:release) adds to them;
--   luajit bench/split_client.lua PORT N ffi TAKE_FILE RELEASE_FILE
--     the bytes in the two files (bench/benchlib.lua's floor: the library's
--     take and release), sent by LuaJIT's FFI straight to libc's send and
--     recv over a socket set up as the library's (1 s timeouts, keepalive):
--     the interpreter's share of a cycle without the library's code.
local port, n, mode = tonumber(arg[1]), tonumber(arg[2]), arg[3]
assert(port and n and (mode == "lib" or mode == "core" or mode == "ffi"),
       "usage: split_client.lua PORT N lib KEY | core KEY | ffi TAKE RELEASE")
local core = require("redislock.core")

local cycle
if mode == "lib" then
  local key = assert(arg[4], "lib needs a KEY")
  local client = require("redislock").new({ port = port })
  cycle = function() assert(assert(client:acquire(key, 10)):release()) end
elseif mode == "core" then
  local key = assert(arg[4], "core needs a KEY")
  local client = require("redislock").new({ port = port })
  local t = assert(require("redislock.hold").FAST[client], "no C client for the common case")
  local mt = {}
  local release, take = core.fast_release(mt), core.fast_take
  -- The fields core.fast_release reads (csrc/rl_lua_client.c): its own
  -- release, the C client, the state, the key and the token.
  local lock = setmetatable({ release = release, _t = t, _state = "held", key = key }, mt)
  cycle = function()
    local fence, tok = take(t, key, 10)
    assert(fence, "the take did not take the lock")
    lock.token = tok
    assert(release(lock) == true, "the release did not release")
  end
else
  local ffi = require("ffi")
  ffi.cdef([[
    int socket(int domain, int type, int protocol);
    int connect(int fd, const void *addr, unsigned len);
    int setsockopt(int fd, int level, int name, const void *value, unsigned len);
    long send(int fd, const void *buf, unsigned long len, int flags);
    long recv(int fd, void *buf, unsigned long len, int flags);
    struct split_sockaddr { unsigned short family, port; unsigned char addr[4]; char zero[8]; };
    struct split_timeval { long sec, usec; };
  ]])
  assert(ffi.abi("le"), "the FFI loop writes the port's bytes for a little-endian machine")
  local C = ffi.C
  -- Linux's numbers (AF_INET, SOCK_STREAM, SOL_SOCKET, SO_*, IPPROTO_TCP, TCP_*, MSG_NOSIGNAL).
  local AF_INET, SOCK_STREAM, SOL_SOCKET, IPPROTO_TCP, MSG_NOSIGNAL = 2, 1, 1, 6, 0x4000
  local SO_KEEPALIVE, SO_RCVTIMEO, SO_SNDTIMEO = 9, 20, 21
  local TCP_NODELAY, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT = 1, 4, 5, 6
  local function read_all(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("*a")
    f:close()
    return s
  end
  local take, release = read_all(assert(arg[4])), read_all(assert(arg[5]))
  local fd = C.socket(AF_INET, SOCK_STREAM, 0)
  assert(fd >= 0, "socket failed")
  local addr = ffi.new("struct split_sockaddr")
  addr.family, addr.port = AF_INET, bit.bor(bit.rshift(port, 8), bit.lshift(bit.band(port, 0xff), 8))
  addr.addr[0], addr.addr[3] = 127, 1
  assert(C.connect(fd, addr, ffi.sizeof(addr)) == 0, "connect failed")
  local function int_opt(level, name, v)
    assert(C.setsockopt(fd, level, name, ffi.new("int[1]", v), 4) == 0, "setsockopt failed")
  end
  int_opt(IPPROTO_TCP, TCP_NODELAY, 1)
  int_opt(SOL_SOCKET, SO_KEEPALIVE, 1)
  int_opt(IPPROTO_TCP, TCP_KEEPIDLE, 15)
  int_opt(IPPROTO_TCP, TCP_KEEPINTVL, 5)
  int_opt(IPPROTO_TCP, TCP_KEEPCNT, 3)
  local tv = ffi.new("struct split_timeval", 1, 0)
  assert(C.setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, tv, ffi.sizeof(tv)) == 0, "setsockopt failed")
  assert(C.setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, tv, ffi.sizeof(tv)) == 0, "setsockopt failed")
  local buf = ffi.new("uint8_t[16384]")
  -- Sends bytes, then reads until `lines` line ends are in: a take is
  -- answered with 7 lines (MULTI's, 2 QUEUED, EXEC's array of SET's and
  -- XADD's: its length and data), taken or not; a release with one, which
  -- must say ":1" (released), so a take that failed stops the run.
  local CR, LF = 13, 10
  local function round_trip(bytes, lines)
    assert(C.send(fd, bytes, #bytes, MSG_NOSIGNAL) == #bytes, "send failed")
    local have, seen = 0, 0
    repeat
      local got = tonumber(C.recv(fd, buf + have, 16384 - have, 0))
      assert(got > 0, "recv failed, the server closed the connection, or the answer was not " .. lines .. " lines")
      for i = have > 0 and have - 1 or 0, have + got - 2 do -- a line end may span two reads
        if buf[i] == CR and buf[i + 1] == LF then seen = seen + 1 end
      end
      have = have + got
    until seen >= lines
    return have
  end
  cycle = function()
    round_trip(take, 7)
    local len = round_trip(release, 1)
    assert(len == 4 and buf[0] == 58 and buf[1] == 49, "the release did not answer :1")
  end
end

local WARM = 200
for _ = 1, WARM do cycle() end
local t0 = core.now()
for _ = 1, n do cycle() end
print(string.format("cycles_per_s=%.1f warm=%d", n / (core.now() - t0), WARM))
