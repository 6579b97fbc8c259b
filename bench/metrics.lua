-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): the uncontended acquire+release with metrics on
-- (redislock.metrics) against metrics off, two clients of one process
-- taking turns in blocks of BENCH_BLOCK (100) cycles, the side that starts
-- a pair alternating, so that both meet the same machine from one moment
-- to the next (on a loaded 2-core machine rates swing by half within
-- seconds: slices of thousands of cycles do not cancel that out). Each of
-- BENCH_ROUNDS (7) rounds runs BENCH_CYCLES (20000) cycles per side; a
-- round's ratio is its two rates' (target: >= 0.95), and the figure is the
-- median over the rounds, with their spread.
-- usage (from bench/run.sh, pinned by taskset): metrics.lua <placement name>
local redislock = require("redislock")
local B = require("benchlib")

local N = B.knob("BENCH_CYCLES", 20000)
local ROUNDS = B.knob("BENCH_ROUNDS", 7)
local BLOCK = B.knob("BENCH_BLOCK", 100)
local KEY, TTL = "bench", 10
local id = B.id

local off = redislock.new({ port = B.port })
local on = redislock.new({ port = B.port, metrics = require("redislock.metrics").new() })

-- Seconds that n cycles of client c take.
local function cycles(c, n)
  local t0 = B.now()
  for _ = 1, n do assert(assert(c:acquire(KEY, TTL)):release()) end
  return B.now() - t0
end

cycles(off, 1000)
cycles(on, 1000)
local ratios, rates_off, rates_on = {}, {}, {}
for _ = 1, ROUNDS do
  local t_off, t_on = 0, 0
  for pair = 1, math.floor(N / BLOCK) do
    if pair % 2 == 1 then
      t_off = t_off + cycles(off, BLOCK)
      t_on = t_on + cycles(on, BLOCK)
    else
      t_on = t_on + cycles(on, BLOCK)
      t_off = t_off + cycles(off, BLOCK)
    end
  end
  ratios[#ratios + 1] = t_off / t_on
  rates_off[#rates_off + 1] = N / t_off
  rates_on[#rates_on + 1] = N / t_on
end
local rate_off = math.floor(B.percentile(rates_off, 50) + 0.5)
B.emit({ name = "cycle.metrics_off/" .. id, value = rate_off, unit = "cycles/s",
         note = string.format("median of %d rounds of %d cycles, in blocks of %d", ROUNDS, N, BLOCK),
         label = B.where .. ": acquire+release, metrics off" })
B.emit({ name = "cycle.metrics_on/" .. id, value = math.floor(B.percentile(rates_on, 50) + 0.5), unit = "cycles/s",
         baseline = "cycle.metrics_off/" .. id, baseline_value = rate_off, ratio = B.percentile(ratios, 50),
         target = { ">=", 0.95 },
         note = string.format("median of %d rounds' ratios (%.3f-%.3f) of %d cycles each side, blocks of %d",
                              ROUNDS, B.percentile(ratios, 0), B.percentile(ratios, 100), N, BLOCK),
         label = B.where .. ": acquire+release, metrics on vs off" })
