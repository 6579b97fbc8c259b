-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): what cluster routing costs the client. One
-- redis-server of its own, cluster-enabled and serving every slot (a cluster
-- of one node), pinned to core BENCH_SERVER_CPU (0). In the same slices
-- (benchlib's), uncontended acquire+release cycles through a cluster client
-- (slot computed, table looked up, redirects checked) as a ratio to the same
-- cycles through a single-server client on the same node (target >= 0.95).
-- usage (from bench/run.sh, pinned by taskset): cluster.lua <placement name>
local redislock = require "redislock"
local core = require "redislock.core"
local B = require "benchlib"

local PLACEMENT = arg[1] or "unpinned"
local N = B.knob("BENCH_CYCLES", 4000)
local SLICES = B.knob("BENCH_SLICES", 15)
local id = (jit and "luajit" or "lua5.4") .. "/" .. PLACEMENT  -- luacheck: ignore (jit)
local where = B.interp .. ", " .. PLACEMENT

local dir = (B.run("mktemp -d"):gsub("%s+$", ""))
local port = B.free_port()
while port > 55535 do port = B.free_port() end -- the cluster bus listens on port + 10000
B.run(table.concat({ "cd", B.sh_quote(dir), "&& redis-server --bind 127.0.0.1 --port", port,
  "--cluster-enabled yes --save '' --appendonly no --daemonize yes --pidfile", dir .. "/redis.pid --logfile",
  dir .. "/redis.log --dir", B.sh_quote(dir) }, " "))
local pid
for _ = 1, 200 do
  local f = io.open(dir .. "/redis.pid")
  pid = f and tonumber(f:read("*a"))
  if f then f:close() end
  if pid and B.run("redis-cli -p " .. port .. " PING"):find("PONG", 1, true) then break end
  core.sleep(0.02)
end
assert(pid, "redis-server did not start")
B.run("redis-cli -p " .. port .. " CLUSTER ADDSLOTSRANGE 0 16383")
for _ = 1, 200 do
  if B.run("redis-cli -p " .. port .. " CLUSTER INFO"):find("cluster_state:ok", 1, true) then break end
  core.sleep(0.05)
end
B.run("taskset -apc " .. (os.getenv("BENCH_SERVER_CPU") or "0") .. " " .. pid .. " >/dev/null")

local function done()
  os.execute("kill " .. pid .. " 2>/dev/null")
  for _ = 1, 100 do
    if not io.open("/proc/" .. pid .. "/stat") then break end
    core.sleep(0.05)
  end
  os.execute("rm -rf " .. B.sh_quote(dir))
end

local function cycles_on(opts)
  local client = redislock.new(opts)
  assert(assert(client:acquire("warm", 10)):release())
  return function()
    local t0 = core.now()
    for _ = 1, N do assert(assert(client:acquire("bench", 10)):release()) end
    return N / (core.now() - t0)
  end
end

local ok, err = pcall(function()
  local rates = B.slices({
    { "single", cycles_on({ port = port }) },
    { "cluster", cycles_on({ cluster = { "127.0.0.1:" .. port } }) },
  }, SLICES)
  local single = math.floor(B.percentile(rates.single, 50) + 0.5)
  local cluster = math.floor(B.percentile(rates.cluster, 50) + 0.5)
  local ratio, lo, hi = B.median_ratio(rates.cluster, rates.single)
  B.emit({ name = "cycle.single_node/" .. id, value = single, unit = "cycles/s",
           note = string.format("median of %d slices of %d cycles", SLICES, N),
           label = where .. ": acquire+release, single-server client on a one-node cluster" })
  B.emit({ name = "cycle.cluster/" .. id, value = cluster, unit = "cycles/s", baseline = "cycle.single_node/" .. id,
           baseline_value = single, ratio = ratio, target = { ">=", 0.95 },
           note = string.format("median of %d slices of %d cycles; slice ratios %.2f-%.2f", SLICES, N, lo, hi),
           label = where .. ": acquire+release, cluster client (routing), same node" })
end)
done()
assert(ok, err)
