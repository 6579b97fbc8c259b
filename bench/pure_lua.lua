-- SPDX-License-Identifier: MIT
-- The pure-Lua peer of `make bench` (a benchmark, not a test): the ten lines a
-- user would write instead of using redislock, on Debian's lua5.3 with
-- lua-redis (redis-lua 2.0.5 over luasocket): SET key token NX PX ttl, then
-- the usual compare-and-delete script by EVALSHA. No fence, no waking, no
-- renewal. The token is 32 hex digits from math.random (what such code
-- usually does; redislock's come from the OS).
-- usage: lua5.3 bench/pure_lua.lua PORT N  -> prints cycles_per_s=<rate> warm=<cycles run before the clock>
local redis = require("redis")
local socket = require("socket")

local port, n = tonumber(arg[1]), tonumber(arg[2])
local client = redis.connect("127.0.0.1", port)
client:define_command("script_load", { command = "SCRIPT" })
local sha = client:script_load("LOAD",
  "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end")

local function token()
  local t = {}
  for i = 1, 4 do t[i] = string.format("%08x", math.random(0, 0xffffffff)) end
  return table.concat(t)
end

local function cycle()
  local tok = token()
  assert(client:set("bench:pure-lua", tok, "NX", "PX", 10000), "the lock was busy")
  assert(client:evalsha(sha, 1, "bench:pure-lua", tok) == 1, "the lock was not ours")
end

local WARM = 200
for _ = 1, WARM do cycle() end
local t0 = socket.gettime()
for _ = 1, n do cycle() end
print(string.format("cycles_per_s=%.1f warm=%d", n / (socket.gettime() - t0), WARM))
