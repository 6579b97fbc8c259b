-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): what cluster routing costs the client. One
-- redis-server of its own, cluster-enabled and serving every slot (a cluster
-- of one node), pinned to core BENCH_SERVER_CPU (0). In the same slices
-- (benchlib's), uncontended acquire+release cycles through a cluster client
-- (slot computed, table looked up, redirects checked) as a ratio to the same
-- cycles through a single-server client on the same node (target >= 0.95).
-- usage (from bench/run.sh, pinned by taskset): cluster.lua <placement name>
local B = require("benchlib")

local N, SLICES = B.knob("BENCH_CYCLES", 4000), B.knob("BENCH_SLICES", 15)
local id, where = B.id, B.where

local dir = (B.run("mktemp -d"):gsub("%s+$", ""))
local port = B.free_port()
while port > 55535 do port = B.free_port() end -- the cluster bus listens on port + 10000
local pids = B.start_servers(dir, { { port = port, args = "--cluster-enabled yes --dir " .. B.sh_quote(dir) } }, true)
B.run("redis-cli -p " .. port .. " CLUSTER ADDSLOTSRANGE 0 16383")
for _ = 1, 200 do
  if B.run("redis-cli -p " .. port .. " CLUSTER INFO"):find("cluster_state:ok", 1, true) then break end
  require("redislock.core").sleep(0.05)
end

local ok, err = pcall(function()
  local rates = B.slices({
    { "single", B.cycles_on({ port = port }, N) },
    { "cluster", B.cycles_on({ cluster = { "127.0.0.1:" .. port } }, N) },
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
B.stop_servers(pids, dir)
assert(ok, err)
