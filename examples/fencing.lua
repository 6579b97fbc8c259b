-- SPDX-License-Identifier: MIT
-- A fenced write. A lock holder can pause (GC, swap, SIGSTOP, a slow call)
-- past its TTL; meanwhile another process takes the lock and writes. When the
-- first one wakes up, only the resource itself can stop its stale write: it
-- keeps the highest fence it has seen and refuses a write carrying a lower
-- one. Here the resource is a Redis hash, guarded by a server-side script;
-- a database would do the same with `UPDATE ... WHERE fence <= ?`.
--
-- Run by hand (needs a redis-server; REDIS_URL, else 127.0.0.1:6379):
--  REDIS_URL=redis://127.0.0.1:6379 LUA_PATH="lua/?.lua;;" LUA_CPATH="build/lua5.4/?.so;;" lua5.4 examples/fencing.lua
-- It uses the keys "fencing:row" and the lock "fencing".

local redislock = require "redislock"
local core = require "redislock.core"  -- only for core.sleep, to play the pause

-- Writes value into the row unless the row has seen a newer fence. 1 or 0.
local FENCED_WRITE = [[
local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < seen then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
]]

local url = os.getenv("REDIS_URL")
local client = redislock.new{ url = (url and url ~= "") and url or "redis://127.0.0.1:6379" }
assert(client:command("DEL", "fencing:row"))

local function write(who, fence)
  local ok = assert(client:command("EVAL", FENCED_WRITE, 1, "fencing:row", fence, who))
  print(string.format("%s writes with fence %d: %s", who, fence, ok == 1 and "accepted" or "refused (stale fence)"))
end

-- A takes the lock, without renewal, and then pauses past its TTL.
local a = assert(client:acquire("fencing", 0.2))
print(string.format("A holds the lock with fence %d, then pauses for 0.4 s", a.fence))
core.sleep(0.4)

-- Meanwhile the lock expired; B takes it and writes.
local b = assert(client:acquire("fencing", 5))
print(string.format("B holds the lock with fence %d", b.fence))
write("B", b.fence)

-- A wakes up and, not knowing, writes: the row refuses the older fence.
write("A", a.fence)
print("A's lock:", a:check())
assert(b:release())
print("the row says: " .. assert(client:command("HGET", "fencing:row", "value")))
