-- SPDX-License-Identifier: MIT
-- The other primitives, each with several worker processes:
--
-- 1. A semaphore limits calls to a fragile upstream: 6 processes make 5 calls
--    each, and at most 2 calls are ever in flight (every process asks the
--    same semaphore "upstream", limit 2).
-- 2. A read-write lock guards a cache of two keys (a version and a body that
--    must match): readers serve from it under read holds, a refresher
--    rewrites both under the write hold; no reader ever sees them torn.
-- 3. A multi-key lock moves money: transfers between two accounts in both
--    directions take both accounts' locks at once (all or none, no deadlock
--    whatever the order); the total stays what it was.
--
-- Run by hand (needs a redis-server; REDIS_URL, else 127.0.0.1:6379):
--  REDIS_URL=redis://127.0.0.1:6379 LUA_PATH="lua/?.lua;;" LUA_CPATH="build/lua5.4/?.so;;" \
--    lua5.4 examples/primitives.lua
-- It overwrites keys under demo:. Exit status 0 only when all three held.

local redislock = require("redislock")
local core = require("redislock.core")
-- The worker processes (examples/workers.lua).
local workers = dofile((arg[0]:match("^(.*/)") or "") .. "workers.lua")
local redis = workers.redis

-- Worker modes: each prints one line for the parent.
local WORKERS = {
  -- 5 calls to the upstream, each under a permit (at most 2 at once).
  upstream = function(client)
    local upstream = client:semaphore("demo:upstream", 2)
    for _ = 1, 5 do
      upstream:with_permit(10, function()
        local now_in = redis(client, "INCR", "demo:in_flight")
        redis(client, "RPUSH", "demo:in_flight_seen", now_in)
        core.sleep(0.02) -- the upstream call
        redis(client, "DECR", "demo:in_flight")
      end, { wait = 30 })
    end
    print("called 5 times")
  end,
  -- 20 reads of the cache under read holds.
  reader = function(client)
    local cache, torn = client:rwlock("demo:cache"), 0
    for _ = 1, 20 do
      cache:with_read(5, function()
        local version = redis(client, "GET", "demo:cache:version")
        core.sleep(0.002) -- serving takes a moment
        if redis(client, "GET", "demo:cache:body") ~= "body of " .. version then torn = torn + 1 end
      end, { wait = 10 })
    end
    print("torn " .. torn)
  end,
  -- 5 refreshes of the cache under the write hold.
  refresher = function(client)
    local cache = client:rwlock("demo:cache")
    for _ = 1, 5 do
      cache:with_write(5, function()
        local version = redis(client, "INCR", "demo:cache:version")
        core.sleep(0.005) -- rebuilding takes a moment: readers would see it half done
        redis(client, "SET", "demo:cache:body", "body of " .. version)
      end, { wait = 10 })
      core.sleep(0.01)
    end
    print("refreshed 5 times")
  end,
  -- 20 transfers of 1 between demo:acct:a and demo:acct:b, in a direction.
  transfer = function(client, from, to)
    for _ = 1, 20 do
      client:with_lock({ from, to }, 5, function()
        local a, b = tonumber(redis(client, "GET", from)), tonumber(redis(client, "GET", to))
        core.sleep(0.001)
        redis(client, "SET", from, a - 1)
        redis(client, "SET", to, b + 1)
      end, { wait = 10 })
    end
    print("moved 20")
  end,
}

if arg[1] == "worker" then -- started by workers.run below
  WORKERS[arg[2]](redislock.default_client(), arg[3], arg[4])
  os.exit(0)
end

-- Runs the workers (lists of mode and arguments) at once; their output lines.
local function run(list)
  return table.concat(workers.run(list))
end

local client = redislock.default_client()
local ok = true

-- 1. The semaphore.
redis(client, "DEL", "demo:in_flight", "demo:in_flight_seen")
run({ { "upstream" }, { "upstream" }, { "upstream" }, { "upstream" }, { "upstream" }, { "upstream" } })
local most, calls = 0, 0
for _, n in ipairs(redis(client, "LRANGE", "demo:in_flight_seen", 0, -1)) do
  most, calls = math.max(most, tonumber(n)), calls + 1
end
print(string.format("semaphore: %d calls to the upstream, at most %d at once (limit 2)", calls, most))
ok = ok and calls == 30 and most == 2

-- 2. The read-write lock.
redis(client, "SET", "demo:cache:version", 0)
redis(client, "SET", "demo:cache:body", "body of 0")
local out = run({ { "reader" }, { "reader" }, { "reader" }, { "reader" }, { "refresher" } })
local torn = 0
for n in out:gmatch("torn (%d+)") do torn = torn + tonumber(n) end
print(string.format("read-write lock: 80 reads during 5 refreshes, %d saw the cache torn", torn))
ok = ok and torn == 0 and select(2, out:gsub("torn ", "")) == 4

-- 3. The multi-key lock.
redis(client, "SET", "demo:acct:a", 100)
redis(client, "SET", "demo:acct:b", 100)
out = run({ { "transfer", "demo:acct:a", "demo:acct:b" }, { "transfer", "demo:acct:b", "demo:acct:a" },
            { "transfer", "demo:acct:a", "demo:acct:b" }, { "transfer", "demo:acct:b", "demo:acct:a" } })
local total = tonumber(redis(client, "GET", "demo:acct:a")) + tonumber(redis(client, "GET", "demo:acct:b"))
print(string.format("multi-key lock: 80 transfers both ways, total %d (was 200)", total))
ok = ok and total == 200 and select(2, out:gsub("moved 20", "")) == 4

os.exit(ok and 0 or 1)
