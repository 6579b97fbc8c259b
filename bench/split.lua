-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): where an uncontended cycle's time goes, against
-- the minimal lock (benchlib's minimal: SET NX PX, then the usual
-- compare-and-delete script). Each client below runs in a process of its
-- own, on this process's core (bench/run.sh pins it), BENCH_SPLIT_ROUNDS
-- (9) times in turn, BENCH_CYCLES (4000) cycles each:
--   minimal      build/bench/floor, the minimal lock's bytes;
--   raw          build/bench/floor, the library's bytes (the take, MULTI SET
--                XADD EXEC, and the release script): what the server's
--                work for the fence and the waiters costs;
--   raw_no_multi the library's bytes without the take's MULTI and EXEC (SET
--                and XADD sent together, not atomic: not a lock the library
--                may take): what the transaction costs;
--   raw_socket   the same as raw, over a socket set up as the library's
--                (1 s read and write timeouts, keepalive, send and recv):
--                what the socket's options cost;
--   ffi          the same bytes and socket from a LuaJIT loop through the
--                FFI (bench/split_client.lua): what an interpreter costs;
--   core.lua5.4, core.luajit  the C core's calls alone (core.fast_take,
--                core.fast_release), without the Lua layer around them;
--   lua5.4, luajit  redislock's acquire+release: what the Lua layer costs
--                on top;
--   pure_lua     the pure-Lua minimal lock (bench/pure_lua.lua), when lua5.3
--                and lua-redis are installed.
-- For each: the rate as a ratio to the minimal lock's in the same round
-- (median, lowest, highest), and the server's CPU time per cycle as a
-- ratio to the minimal lock's, read from /proc/<pid>/schedstat (the time
-- the kernel counts the server's threads on a CPU, in ns) over the
-- client's whole run: its warm-up cycles counted (each child says how
-- many it ran: warm=), its connecting not taken out (a few commands
-- against 4,000 cycles). Then each step's own cost, as the ratio of two
-- neighbours' rates round by round (raw_no_multi to raw, raw_socket to
-- raw, ffi to raw_socket, core to ffi, the library to core).
-- usage (from bench/run.sh, pinned by taskset): lua5.4 bench/split.lua <placement>
local B = require("benchlib")
local core = require("redislock.core")

local N, ROUNDS = B.knob("BENCH_CYCLES", 4000), B.knob("BENCH_SPLIT_ROUNDS", 9)
local KEY, TTL = "bench", 10
local root = B.root

local pid_file = assert(io.open(assert(os.getenv("REDIS_DIR"), "REDIS_DIR is not set") .. "/redis.pid"))
local server_pid = assert(tonumber(pid_file:read("*l")), "no server PID")
pid_file:close()

-- The server's CPU time so far, in ns: every thread's, from schedstat.
local function server_ns()
  local total = 0
  local list = assert(io.popen("ls /proc/" .. server_pid .. "/task"))
  for tid in list:lines() do
    local f = io.open("/proc/" .. server_pid .. "/task/" .. tid .. "/schedstat")
    if f then
      total = total + (tonumber(f:read("*n")) or 0)
      f:close()
    end
  end
  list:close()
  return total
end

local client = require("redislock").new({ port = B.port })
local floor = B.floor(client, KEY, TTL)
local minimal = B.minimal(client, TTL)
-- The take without its transaction: what MULTI and EXEC cost.
local MULTI, EXEC = core.encode("MULTI"), core.encode("EXEC")
local take = floor.acquire
assert(take:sub(1, #MULTI) == MULTI and take:sub(-#EXEC) == EXEC, "the take is not MULTI ... EXEC")
local no_multi = B.temp_file(take:sub(#MULTI + 1, -#EXEC - 1))

local function lua_env(lua)
  local cpath = root .. "/build/" .. lua .. "/?.so;;"
  return string.format("env LUA_CPATH=%s LUA_CPATH_5_4=%s ", B.sh_quote(cpath), B.sh_quote(cpath))
end

-- The clients: { name, run(n) -> rate[, warm-up cycles] }.
local clients = {
  { "minimal", function(n) return minimal:rate(n) end },
  { "raw", function(n) return floor:rate(n) end },
  { "raw_no_multi", function(n)
    return B.child_rate("bench/floor without MULTI", table.concat({ root .. "/build/bench/floor", B.port, n,
                                                                     no_multi, floor.files[2], 2 }, " "))
  end },
  { "raw_socket", function(n) return floor:rate(n, "library") end },
}
local _, has_jit = B.run("command -v luajit")
if has_jit then
  clients[#clients + 1] = { "ffi", function(n)
    return B.child_rate("the FFI loop", lua_env("luajit") .. table.concat({ "luajit", root .. "/bench/split_client.lua",
      B.port, n, "ffi", floor.files[1], floor.files[2] }, " "))
  end }
end
local luas = has_jit and { "lua5.4", "luajit" } or { "lua5.4" }
for _, mode in ipairs({ "core", "lib" }) do
  for _, lua in ipairs(luas) do
    clients[#clients + 1] = { (mode == "core" and "core." or "") .. lua, function(n)
      return B.child_rate("the " .. lua .. " " .. mode .. " loop", lua_env(lua) ..
        table.concat({ lua, root .. "/bench/split_client.lua", B.port, n, mode, KEY }, " "))
    end }
  end
end
local pure_lua = B.pure_lua()
if pure_lua then clients[#clients + 1] = { "pure_lua", pure_lua } end

-- A cycle of the library's first (it loads the scripts the floors send by
-- SHA), then each client once to warm up, then the rounds: rates and the
-- server's ns per cycle.
assert(assert(client:acquire(KEY, TTL)):release())
for _, c in ipairs(clients) do c[2](500) end
local measures = {}
local cpu = {}
for _, c in ipairs(clients) do
  cpu[c[1]] = {}
  measures[#measures + 1] = { c[1], function()
    local before = server_ns()
    local rate, warm = c[2](N)
    local list = cpu[c[1]]
    list[#list + 1] = (server_ns() - before) / (N + (warm or 0))
    return rate
  end }
end
local rates = B.slices(measures, ROUNDS)
floor:close()
minimal:close()
os.remove(no_multi)

local where = B.placement
local note = string.format("median of %d rounds of %d cycles, each client in turn", ROUNDS, N)
local min_ns = B.percentile(cpu.minimal, 50)
for _, c in ipairs(clients) do
  local name = c[1]
  local ratio, lo, hi = B.median_ratio(rates[name], rates.minimal)
  B.emit({ name = "split.rate." .. name .. "/" .. where, value = math.floor(B.percentile(rates[name], 50) + 0.5),
           unit = "cycles/s", baseline = "split.rate.minimal/" .. where,
           baseline_value = math.floor(B.percentile(rates.minimal, 50) + 0.5), ratio = ratio,
           note = string.format("%s; round ratios %.3f-%.3f", note, lo, hi),
           label = where .. ": " .. name .. ", cycles/s vs the minimal lock's" })
  local ns = B.percentile(cpu[name], 50)
  B.emit({ name = "split.server." .. name .. "/" .. where, value = math.floor(ns + 0.5), unit = "ns/cycle",
           baseline = "split.server.minimal/" .. where, baseline_value = math.floor(min_ns + 0.5),
           note = string.format("/proc/<pid>/schedstat; %s; lowest %.0f, highest %.0f", note,
                                B.percentile(cpu[name], 0), B.percentile(cpu[name], 100)),
           label = where .. ": " .. name .. ", the server's CPU per cycle vs the minimal lock's" })
end

-- Each step against the one before it, round by round.
local steps = { { "raw_no_multi", "raw" }, { "raw_socket", "raw" }, { "ffi", "raw_socket" } }
for _, lua in ipairs(luas) do
  steps[#steps + 1] = { "core." .. lua, has_jit and "ffi" or "raw_socket" }
  steps[#steps + 1] = { lua, "core." .. lua }
end
for _, s in ipairs(steps) do
  local ratio, lo, hi = B.median_ratio(rates[s[1]], rates[s[2]])
  B.emit({ name = "split.step." .. s[1] .. "/" .. where, value = math.floor(B.percentile(rates[s[1]], 50) + 0.5),
           unit = "cycles/s", baseline = "split.rate." .. s[2] .. "/" .. where,
           baseline_value = math.floor(B.percentile(rates[s[2]], 50) + 0.5), ratio = ratio,
           note = string.format("%s; round ratios %.3f-%.3f", note, lo, hi),
           label = where .. ": " .. s[1] .. " vs " .. s[2] .. ", round by round" })
end
