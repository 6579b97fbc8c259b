-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): what the other primitives cost against the lock,
-- on the suite's redis-server (bench/run.sh's, pinned to core 0). In the same
-- slices (benchlib's), uncontended cycles of: lock acquire+release (the
-- baseline), a semaphore permit's acquire+release (limit 5), a read hold's,
-- a write hold's, and a multi-key lock's over 2 keys; each as a ratio to the
-- lock's. A lock's first try is a MULTI/EXEC without a script; the others
-- run a script that reads the server's clock and prunes expired holders.
-- Also the lock's cycle without who holds it in its token (holder = false)
-- against the default, with it: what that metadata costs.
-- usage (from bench/run.sh, pinned by taskset): primitives.lua <placement name>
local redislock = require("redislock")
local B = require("benchlib")

local N, SLICES = B.knob("BENCH_CYCLES", 4000), B.knob("BENCH_SLICES", 15)
local id, where = B.id, B.where

local client = redislock.new({ port = B.port })
local bare = redislock.new({ port = B.port, holder = false })
local sem, rw = client:semaphore("bench:pool", 5), client:rwlock("bench:doc")

-- A slice of N cycles of take(); returns cycles per second.
local function cycles(take)
  return B.rate(N, function() assert(assert(take()):release()) end)
end

local rates = B.slices({
  { "lock", cycles(function() return client:acquire("bench", 10) end) },
  { "bare", cycles(function() return bare:acquire("bench", 10) end) },
  { "permit", cycles(function() return sem:acquire(10) end) },
  { "read", cycles(function() return rw:read(10) end) },
  { "write", cycles(function() return rw:write(10) end) },
  { "multi", cycles(function() return client:acquire({ "bench:a", "bench:b" }, 10) end) },
}, SLICES)
local lock = math.floor(B.percentile(rates.lock, 50) + 0.5)
B.emit({ name = "prim.lock/" .. id, value = lock, unit = "cycles/s",
         note = string.format("median of %d slices of %d cycles", SLICES, N),
         label = where .. ": lock acquire+release (the baseline)" })
local bare_ratio, blo, bhi = B.median_ratio(rates.lock, rates.bare)
local bare_rate = math.floor(B.percentile(rates.bare, 50) + 0.5)
B.emit({ name = "prim.bare/" .. id, value = bare_rate, unit = "cycles/s",
         note = string.format("median of %d slices of %d cycles", SLICES, N),
         label = where .. ": lock acquire+release, holder = false (a token of 32 hex digits only)" })
B.emit({ name = "prim.holder/" .. id, value = lock, unit = "cycles/s", baseline = "prim.bare/" .. id,
         baseline_value = bare_rate, ratio = bare_ratio,
         note = string.format("median of %d slices of %d cycles; slice ratios %.2f-%.2f", SLICES, N, blo, bhi),
         label = where .. ": lock acquire+release with the holder in the token (the default) / without" })
for _, p in ipairs({ { "permit", "semaphore permit acquire+release (limit 5)" },
                     { "read", "read hold acquire+release" }, { "write", "write hold acquire+release" },
                     { "multi", "multi-key lock acquire+release, 2 keys" } }) do
  local ratio, lo, hi = B.median_ratio(rates[p[1]], rates.lock)
  B.emit({ name = "prim." .. p[1] .. "/" .. id, value = math.floor(B.percentile(rates[p[1]], 50) + 0.5),
           unit = "cycles/s", baseline = "prim.lock/" .. id, baseline_value = lock, ratio = ratio,
           note = string.format("median of %d slices of %d cycles; slice ratios %.2f-%.2f", SLICES, N, lo, hi),
           label = where .. ": " .. p[2] })
end
client:close()
bare:close()
