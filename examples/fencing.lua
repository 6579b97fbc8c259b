-- SPDX-License-Identifier: MIT
-- A fenced write. A lock holder can pause (GC, swap, SIGSTOP, a slow call)
-- past its TTL; meanwhile another process takes the lock and writes. When the
-- first one wakes up, only the resource itself can stop its stale write: it
-- keeps the highest fence it has accepted and refuses a write carrying a
-- lower one. lock:fenced() does that for a Redis resource (the check, the
-- write and the record in one script); a database would do the same with
-- `UPDATE ... WHERE fence <= ?`.
--
-- Run by hand (needs a redis-server; REDIS_URL, else 127.0.0.1:6379):
--  REDIS_URL=redis://127.0.0.1:6379 LUA_PATH="lua/?.lua;;" LUA_CPATH="build/lua5.4/?.so;;" lua5.4 examples/fencing.lua
-- It uses the keys "fencing:row" (and its fence record, "{fencing:row}:fence")
-- and the lock "fencing".

local redislock = require("redislock")
local core = require("redislock.core")  -- only for core.sleep, to play the pause

local url = os.getenv("REDIS_URL")
local client = redislock.new{ url = (url and url ~= "") and url or "redis://127.0.0.1:6379" }
assert(client:command("DEL", "fencing:row", "{fencing:row}:fence"))

local function write(who, lock)
  local ok, err = lock:fenced():hset("fencing:row", "value", who)
  print(string.format("%s writes with fence %d: %s", who, lock.fence, ok and "accepted" or "refused (" .. err .. ")"))
end

-- A takes the lock, without renewal, and then pauses past its TTL.
local a = assert(client:acquire("fencing", 0.2))
print(string.format("A holds the lock with fence %d, then pauses for 0.4 s", a.fence))
core.sleep(0.4)

-- Meanwhile the lock expired; B takes it and writes.
local b = assert(client:acquire("fencing", 5))
print(string.format("B holds the lock with fence %d", b.fence))
write("B", b)

-- A wakes up and, not knowing, writes: the row refuses the older fence.
write("A", a)
print("A's lock:", a:check())
assert(b:release())
print("the row says: " .. assert(client:command("HGET", "fencing:row", "value")))
