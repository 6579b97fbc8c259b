-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): uncontended acquire+release cycles per second from
-- one client, as a ratio to floors taken in the same run and placement:
--  * the raw floor, build/bench/floor (bench/floor.c): the very bytes the
--    library sends (core.encode_script: the take, MULTI SET XADD EXEC, then the
--    release script), one write and one read per round trip over a plain
--    socket, no library. Against it: the cycle (>= 0.95 on different
--    cores, >= 0.90 on one, issue 56's bars);
--  * the minimal lock, the floor a user compares with: the same raw client
--    sending SET key token NX PX ttl, then EVALSHA of the usual
--    compare-and-delete script (no fence, no waking, no fairness); and
--    redis-benchmark -c 1 with these two commands, one at a time (it repeats
--    a command, so most of its SETs find the key taken and most of its
--    compare-and-deletes find none: the same round trips, less work). Against
--    it: the cycle (>= 0.95 on different cores, >= 0.90 on one), and the
--    server's CPU time per cycle (INFO cpu over BENCH_CPU_CYCLES, 20000;
--    <= 1.10).
--  * the pure-Lua minimal lock a user would write instead (bench/pure_lua.lua:
--    Debian's lua5.3 with lua-redis), which redislock must be ahead of
--    (ratio >= 1.15, issue 56's bar); skipped when those packages are missing.
-- Also with_lock with an empty fn as a ratio to a bare cycle, and a wire check:
-- the bytes and server-side commands per cycle of the library and of the raw
-- floor, from INFO, must be the same.
-- Each figure is taken BENCH_SLICES (15) times, in slices of BENCH_CYCLES
-- (4000) cycles, the four in turn (benchlib's slices): ratios are the median
-- of the ratios within a slice, rates the median rate.
-- With BENCH_METRICS=1, also the cycle of a client that counts its holds
-- (redislock.metrics), in the same slices, as a ratio to the bare cycle
-- (>= 0.95).
-- usage (from bench/run.sh, pinned by taskset): cycle.lua <placement name>
local redislock = require("redislock")
local core = require("redislock.core")
local B = require("benchlib")

local PLACEMENT = B.placement
local N, SLICES = B.knob("BENCH_CYCLES", 4000), B.knob("BENCH_SLICES", 15)
local KEY, TTL = "bench", 10
local id, where = B.id, B.where

local client = redislock.new({ port = B.port })
local metered = os.getenv("BENCH_METRICS") == "1"
  and redislock.new({ port = B.port, metrics = require("redislock.metrics").new() })
local raw = core.new({ port = B.port })  -- for INFO, on a connection of its own

-- The exact bytes of one cycle as the library sends them.
local floor = B.floor(client, KEY, TTL)
local function raw_floor(n) return floor:rate(n) end

-- The minimal lock, from the same raw client.
local minimal = B.minimal(raw, TTL)
local function minimal_floor(n) return minimal:rate(n) end
local CPU_CYCLES = B.knob("BENCH_CPU_CYCLES", 20000)

-- The pure-Lua minimal lock, in a process of its own (lua5.3, lua-redis).
local pure_lua = B.pure_lua()

-- Requests per second redis-benchmark gets for one command from one client.
local function redis_benchmark(args)
  local cmd = { "redis-benchmark", "-p", B.port, "-c", "1", "-n", N, "--csv" }
  for _, a in ipairs(args) do cmd[#cmd + 1] = B.sh_quote(a) end
  local out = B.run(table.concat(cmd, " "))
  local rps = tonumber(out:match('\n"[^"]*","([%d.]+)"'))
  return (assert(rps, "redis-benchmark said: " .. out))
end

-- The redis-benchmark floor for one minimal cycle: each command at its own rate.
local function benchmark_floor()
  local acq = redis_benchmark({ "SET", "minimal", minimal.token, "NX", "PX", TTL * 1000 })
  local rel = redis_benchmark({ "EVALSHA", minimal.sha, 1, "minimal", minimal.token })
  return 1 / (1 / acq + 1 / rel)
end

local function cycles(n, c)
  c = c or client
  local t0 = core.now()
  for _ = 1, n do
    local lock = assert(c:acquire(KEY, TTL))
    assert(lock:release())
  end
  return n / (core.now() - t0)
end

local function noop() end
local function with_locks(n)
  local t0 = core.now()
  for _ = 1, n do client:with_lock(KEY, TTL, noop) end
  return n / (core.now() - t0)
end

-- Server-side counters: bytes read from clients and calls per command.
local function server_counts()
  local stats = assert(raw:command("INFO", "stats"))
  local cmds = assert(raw:command("INFO", "commandstats"))
  local t = { bytes = tonumber(stats:match("total_net_input_bytes:(%d+)")), calls = {} }
  for name, calls in cmds:gmatch("cmdstat_([%w|_-]+):calls=(%d+)") do t.calls[name] = tonumber(calls) end
  return t
end

-- What running fn(n) costs the server per cycle: input bytes, and calls per
-- command as "name:calls,..." (INFO's own bytes and calls taken out).
local function wire(fn, n)
  local idle0 = server_counts()
  local idle1 = server_counts()
  fn(n)
  local after = server_counts()
  local bytes = (after.bytes - idle1.bytes) - (idle1.bytes - idle0.bytes)
  local parts = {}
  for name, calls in pairs(after.calls) do
    local d = calls - (idle1.calls[name] or 0)
    if name == "info" then d = d - (idle1.calls.info - (idle0.calls.info or 0)) end
    if d ~= 0 then parts[#parts + 1] = string.format("%s:%g", name, d / n) end
  end
  table.sort(parts)
  return bytes / n, table.concat(parts, ",")
end

-- The server's CPU time (user + system, microseconds) that fn(n) costs.
local function server_cpu(fn, n)
  local function now_cpu()
    local s = assert(raw:command("INFO", "cpu"))
    return tonumber(s:match("used_cpu_sys:([%d.]+)")) + tonumber(s:match("used_cpu_user:([%d.]+)"))
  end
  local c0 = now_cpu()
  fn(n)
  return (now_cpu() - c0) * 1e6
end

-- Warm up: connect, load the scripts (the floor needs them loaded).
assert(client:with_lock(KEY, TTL, noop) == nil)
cycles(1000)
if metered then cycles(1000, metered) end
raw_floor(1000)
minimal_floor(1000)

-- Server CPU per cycle, each side three times in turn; the medians.
local cpu = { lib = {}, minimal = {} }
for _ = 1, 3 do
  cpu.lib[#cpu.lib + 1] = server_cpu(cycles, CPU_CYCLES) / CPU_CYCLES
  cpu.minimal[#cpu.minimal + 1] = server_cpu(minimal_floor, CPU_CYCLES) / CPU_CYCLES
end

local lib_bytes, lib_calls = wire(cycles, 1000)
local floor_bytes, floor_calls = wire(raw_floor, 1000)

local measures = {
  { "raw", function() return raw_floor(N) end },
  { "minimal", function() return minimal_floor(N) end },
  { "rb", benchmark_floor },
  { "cycle", function() return cycles(N) end },
  { "with_lock", function() return with_locks(N) end },
}
if pure_lua then measures[#measures + 1] = { "pure", function() return (pure_lua(N)) end } end
if metered then measures[#measures + 1] = { "metrics", function() return cycles(N, metered) end } end
local rates = B.slices(measures, SLICES)
floor:close()
minimal:close()

local median = {}
for name, list in pairs(rates) do median[name] = math.floor(B.percentile(list, 50) + 0.5) end
local slices_note = string.format("median of %d slices of %d cycles", SLICES, N)

-- A ratio of two figures, slice by slice, with its note.
local function ratio(a, b)
  local mid, lo, hi = B.median_ratio(rates[a], rates[b])
  return mid, string.format("%s; slice ratios %.2f-%.2f", slices_note, lo, hi)
end

B.emit({ name = "floor.raw/" .. id, value = median.raw, unit = "cycles/s", note = slices_note,
         label = where .. ": raw floor (bench/floor.c, same bytes)" })
local r, note = ratio("cycle", "raw")
B.emit({ name = "cycle/" .. id, value = median.cycle, unit = "cycles/s",
         baseline = "floor.raw/" .. id, baseline_value = median.raw, ratio = r,
         target = { ">=", PLACEMENT == "same-core" and 0.90 or 0.95 }, note = note,
         label = where .. ": acquire+release" })
B.emit({ name = "floor.minimal/" .. id, value = median.minimal, unit = "cycles/s", note = slices_note,
         label = where .. ": minimal lock floor (bench/floor.c: SET NX PX, EVALSHA compare-and-delete)" })
r, note = ratio("rb", "minimal")
B.emit({ name = "floor.redis-benchmark/" .. id, value = median.rb, unit = "cycles/s",
         baseline = "floor.minimal/" .. id, baseline_value = median.minimal, ratio = r, note = note,
         label = where .. ": redis-benchmark -c 1, the minimal lock's commands" })
r, note = ratio("cycle", "minimal")
B.emit({ name = "cycle.vs_minimal/" .. id, value = median.cycle, unit = "cycles/s",
         baseline = "floor.minimal/" .. id, baseline_value = median.minimal, ratio = r,
         target = { ">=", PLACEMENT == "same-core" and 0.90 or 0.95 }, note = note,
         label = where .. ": acquire+release (fenced) vs the minimal lock" })
local lib_cpu, min_cpu = B.percentile(cpu.lib, 50), B.percentile(cpu.minimal, 50)
B.emit({ name = "server_cpu/" .. id, value = lib_cpu, unit = "us/cycle", baseline = "server_cpu.minimal/" .. id,
         baseline_value = min_cpu, target = { "<=", 1.10 },
         note = string.format("redis INFO cpu, median of 3 runs of %d cycles each", CPU_CYCLES),
         label = where .. ": server CPU per acquire+release vs the minimal lock's" })
if pure_lua then
  B.emit({ name = "peer.pure-lua/" .. id, value = median.pure, unit = "cycles/s", note = slices_note,
           label = where .. ": pure-Lua minimal lock (lua5.3, lua-redis: SET NX PX, EVALSHA compare-and-delete)" })
  r, note = ratio("cycle", "pure")
  B.emit({ name = "cycle.vs_pure_lua/" .. id, value = median.cycle, unit = "cycles/s",
           baseline = "peer.pure-lua/" .. id, baseline_value = median.pure, ratio = r, target = { ">=", 1.15 },
           note = note, label = where .. ": acquire+release (fenced) vs the pure-Lua minimal lock" })
end
if metered then
  r, note = ratio("metrics", "cycle")
  B.emit({ name = "cycle.metrics/" .. id, value = median.metrics, unit = "cycles/s",
           baseline = "cycle/" .. id, baseline_value = median.cycle, ratio = r, target = { ">=", 0.95 }, note = note,
           label = where .. ": acquire+release with metrics on (redislock.metrics) vs off" })
end
r, note = ratio("with_lock", "cycle")
B.emit({ name = "with_lock/" .. id, value = median.with_lock, unit = "cycles/s",
         baseline = "cycle/" .. id, baseline_value = median.cycle, ratio = r, target = { ">=", 0.95 }, note = note,
         label = where .. ": with_lock, empty fn" })
B.emit({ name = "wire/" .. id, value = lib_bytes, unit = "bytes/cycle",
         baseline = "floor.raw/" .. id, baseline_value = floor_bytes, target = { "==", 1 },
         met = lib_calls == floor_calls,
         note = lib_calls == floor_calls and ("same server calls per cycle: " .. lib_calls)
           or ("server calls per cycle differ: library " .. lib_calls .. "; floor " .. floor_calls),
         label = where .. ": bytes sent per cycle, library vs floor" })
if lib_calls ~= floor_calls then
  B.say("bench: the library and the floor make different server calls per cycle: %s vs %s", lib_calls, floor_calls)
end
