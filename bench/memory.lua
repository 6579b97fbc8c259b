-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): the resident set size of this client process before
-- and after BENCH_MEMORY_CYCLES (10^6) acquire+release cycles; it must not
-- grow. "Before" is taken after a warm-up (connection, scripts, the
-- interpreter's and allocator's steady state) and a full garbage collection,
-- "after" after another full collection. The allowed growth, 64 KiB, is
-- allocator noise: a leak of even one byte per cycle would add about 1 MiB.
-- LuaJIT's RSS takes a one-off step (64 KiB, machine code for the new loop's
-- trace) in the first tenth, so growth from the first tenth to the end is
-- reported too: it must stay within one page.
-- usage (from bench/run.sh): memory.lua <placement name>
local redislock = require("redislock")
local B = require("benchlib")

local PLACEMENT = arg[1] or "unpinned"
local CYCLES = math.floor(B.knob("BENCH_MEMORY_CYCLES", 1000000) / 10) * 10
local WARMUP = 20000
local ALLOWED_KIB = 64
local id = (jit and "luajit" or "lua5.4")  -- luacheck: ignore (jit)

local client = redislock.new({ port = B.port })

local function cycles(n)
  for _ = 1, n do
    local lock = assert(client:acquire("bench:memory", 10))
    assert(lock:release())
  end
end

local function settle()
  collectgarbage("collect")
  collectgarbage("collect")
end

cycles(WARMUP)
settle()
local before, heap_before = B.rss_kib(), collectgarbage("count")
-- RSS at each tenth of the way, to show where any growth happened.
local marks = {}
local t0 = B.now()
for i = 1, 10 do
  cycles(CYCLES / 10)
  marks[i] = B.rss_kib() - before
end
local elapsed = B.now() - t0
settle()
local after, heap_after = B.rss_kib(), collectgarbage("count")

B.emit({ name = "rss.before/" .. id, value = before, unit = "KiB",
         label = string.format("%s, %s: RSS after %d warm-up cycles", B.interp, PLACEMENT, WARMUP) })
B.emit({ name = "rss.after/" .. id, value = after, unit = "KiB",
         note = string.format("%d cycles in %.1f s; Lua heap %.0f -> %.0f KiB", CYCLES, elapsed,
                              heap_before, heap_after),
         label = string.format("%s, %s: RSS after %d more cycles", B.interp, PLACEMENT, CYCLES) })
B.emit({ name = "rss.growth/" .. id, value = after - before, unit = "KiB", target = { "<=", ALLOWED_KIB },
         note = "growth at each tenth (KiB): " .. table.concat(marks, ","),
         label = string.format("%s: RSS growth over %d cycles", B.interp, CYCLES) })
B.emit({ name = "rss.growth.steady/" .. id, value = marks[10] - marks[1], unit = "KiB",
         target = { "<=", B.page_kib },
         label = string.format("%s: RSS growth from the first tenth to the end", B.interp) })
