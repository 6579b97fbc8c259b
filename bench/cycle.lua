-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): uncontended acquire+release cycles per second from
-- one client, as a ratio to a floor taken in the same run: redis-benchmark -c 1
-- sending the very same two EVALSHA commands, one round trip each. Also
-- with_lock with an empty fn as a ratio to a bare cycle.
-- Run by `make bench` (tools/with-redis.sh provides REDIS_PORT).
local redislock = require "redislock"
local core = require "redislock.core"

local PORT = assert(tonumber(os.getenv("REDIS_PORT")), "REDIS_PORT is not set")
local N = tonumber(os.getenv("BENCH_CYCLES")) or 20000
local ROUNDS = 3
local interp = jit and jit.version or _VERSION

local client = redislock.new({ port = PORT })

-- Requests per second redis-benchmark gets for one command from one client.
local function redis_benchmark(...)
  local args = { "redis-benchmark", "-p", PORT, "-c", "1", "-n", N, "--csv" }
  for _, a in ipairs({ ... }) do args[#args + 1] = "'" .. a .. "'" end
  local p = assert(io.popen(table.concat(args, " ") .. " 2>&1"))
  local out = p:read("*a")
  p:close()
  local rps = tonumber(out:match('\n"[^"]*","([%d.]+)"'))
  return assert(rps, "redis-benchmark said: " .. out)
end

-- The floor for one cycle: the acquire script (taking the resend path, the same
-- round trip) then the release script, each at redis-benchmark's rate.
local function floor_rate()
  local s = core.scripts
  local acq = redis_benchmark("EVALSHA", s.acquire.sha, "2", "lock:{floor}", "lock:{floor}:fence",
                              "token", "10000")
  local rel = redis_benchmark("EVALSHA", s.release.sha, "1", "lock:{floor-free}", "token")
  return 1 / (1 / acq + 1 / rel)
end

local function cycles()
  local t0 = core.now()
  for _ = 1, N do
    local lock = assert(client:acquire("bench", 10))
    assert(lock:release())
  end
  return N / (core.now() - t0)
end

local function noop() end
local function with_locks()
  local t0 = core.now()
  for _ = 1, N do client:with_lock("bench", 10, noop) end
  return N / (core.now() - t0)
end

-- Warm up: connect, load the scripts.
assert(client:with_lock("bench", 10, noop) == nil)
floor_rate()

local best = { floor = 0, cycle = 0, with_lock = 0 }
for _ = 1, ROUNDS do
  best.floor = math.max(best.floor, floor_rate())
  best.cycle = math.max(best.cycle, cycles())
  best.with_lock = math.max(best.with_lock, with_locks())
end

print(string.format("%-44s %12s %8s", interp .. ", " .. N .. " cycles, best of " .. ROUNDS,
                    "cycles/s", "ratio"))
print(string.format("%-44s %12.0f %8s", "floor: redis-benchmark -c 1, same commands", best.floor, "1.00"))
print(string.format("%-44s %12.0f %8.2f", "acquire+release", best.cycle, best.cycle / best.floor))
print(string.format("%-44s %12.0f %8.2f", "with_lock, empty fn (ratio to bare cycle)",
                    best.with_lock, best.with_lock / best.cycle))
-- Machine-readable line.
print(string.format("bench interp=%q floor_cps=%.0f cycle_cps=%.0f cycle_ratio=%.3f "
                    .. "with_lock_cps=%.0f with_lock_ratio=%.3f",
                    interp, best.floor, best.cycle, best.cycle / best.floor,
                    best.with_lock, best.with_lock / best.cycle))
