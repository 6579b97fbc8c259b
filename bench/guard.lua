-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): what a guarded write costs against the plain
-- write it guards, on the suite's redis-server (bench/run.sh's, pinned to
-- core 0). In the same slices (benchlib's), N writes each of: a plain SET
-- (client:command, the baseline), a PING (one round trip), the same SET
-- through lock:fenced() and through lock:owned() (one EVALSHA each: the
-- check, the write and, fenced, the record). Each as its time per write
-- over the plain SET's, and as the round trips (PINGs) it costs beyond it.
-- usage (from bench/run.sh, pinned by taskset): guard.lua <placement name>
local redislock = require("redislock")
local B = require("benchlib")

local N, SLICES = B.knob("BENCH_CYCLES", 4000), B.knob("BENCH_SLICES", 15)
local id, where = B.id, B.where

local client = redislock.new({ port = B.port })
local lock = assert(client:acquire("bench:guard", 3600))
local fenced, owned = lock:fenced(), lock:owned()

-- A slice of N calls of write(); returns calls per second.
local function rate(write)
  return B.rate(N, function() assert(write()) end)
end

local rates = B.slices({
  { "plain", rate(function() return client:command("SET", "bench:doc", "v") end) },
  { "ping", rate(function() return client:command("PING") end) },
  { "fenced", rate(function() return fenced:set("bench:doc", "v") end) },
  { "owned", rate(function() return owned:set("{bench:guard}:doc", "v") end) },
}, SLICES)
local plain = B.percentile(rates.plain, 50)
local ping = B.percentile(rates.ping, 50)
B.emit({ name = "guard.plain/" .. id, value = math.floor(plain + 0.5), unit = "writes/s",
         note = string.format("median of %d slices of %d writes", SLICES, N),
         label = where .. ": plain SET (the baseline)" })
for _, g in ipairs({ { "fenced", "SET through lock:fenced()" }, { "owned", "SET through lock:owned()" } }) do
  local ratio, lo, hi = B.median_ratio(rates.plain, rates[g[1]])
  local r = B.percentile(rates[g[1]], 50)
  -- Round trips beyond the plain write: the extra time per write over a PING's.
  local extra = (1 / r - 1 / plain) / (1 / ping)
  B.emit({ name = "guard." .. g[1] .. "/" .. id, value = math.floor(r + 0.5), unit = "writes/s",
           baseline = "guard.plain/" .. id, baseline_value = math.floor(plain + 0.5), ratio = ratio,
           target = { "<=", 2 }, -- at most one round trip more than the plain write
           note = string.format("median of %d slices of %d writes; time per write / the plain SET's (slices %.2f-%.2f);"
                                .. " %.2f round trips (PINGs) more", SLICES, N, lo, hi, extra),
           label = where .. ": " .. g[2] })
end
assert(lock:release())
client:close()
