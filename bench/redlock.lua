-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): Redlock over five redis-servers of its own (no
-- persistence, so that the figures measure the protocol, not fsync), the
-- client unpinned. In the same slices (benchlib's), uncontended
-- acquire+release cycles:
--  * Redlock over the five, as a ratio to a single-server client on one of
--    them (target >= 0.8);
--  * node-redlock v5 (ioredis) on the same five (bench/node_redlock.js),
--    when node and npm are installed: `npm install` puts it into a
--    temporary folder (BENCH_NODE_MODULES reuses a folder instead), never
--    into the checkout. Ours as a ratio to it;
--  * and, after the slices, what a cycle costs in CPU, the servers' (INFO
--    cpu) and the client's (os.clock), one server vs the five: on a machine
--    with fewer cores than servers, that sum is what bounds the rate.
-- usage (from bench/run.sh): redlock.lua
local redislock = require("redislock")
local B = require("benchlib")

local N = B.knob("BENCH_CYCLES", 4000)
local SLICES = B.knob("BENCH_PEER_SLICES", 9)
local id = (jit and "luajit" or "lua5.4") -- luacheck: ignore (jit)

local dir = (B.run("mktemp -d"):gsub("%s+$", ""))
local ports, servers = {}, {}
for i = 1, 5 do
  ports[i] = B.free_port()
  servers[i] = { port = ports[i] }
end
local pids = B.start_servers(dir, servers)

-- node-redlock, installed into a temporary folder; nil and why when it cannot be.
local function node_peer()
  if not B.run("command -v node && command -v npm"):find("npm", 1, true) then return nil, "no node/npm" end
  local modules = os.getenv("BENCH_NODE_MODULES")
  if not modules then
    modules = dir .. "/node"
    local out, ok = B.run("mkdir -p " .. B.sh_quote(modules) .. " && cd " .. B.sh_quote(modules)
                          .. " && npm install --no-audit --no-fund --silent redlock@5.0.0-beta.2 ioredis@5 2>&1")
    if not ok then return nil, "npm install failed: " .. out:sub(1, 300) end
  end
  local script = B.root .. "/bench/node_redlock.js"
  local version = B.run("cat " .. B.sh_quote(modules .. "/node_modules/redlock/package.json")):match(
    '"version"%s*:%s*"([^"]+)"') or "?"
  return function()
    local out = B.run("NODE_PATH=" .. B.sh_quote(modules .. "/node_modules") .. " node " .. B.sh_quote(script) .. " "
                      .. table.concat(ports, ",") .. " " .. N)
    return (assert(tonumber(out:match("cycles_per_s=([%d.e+]+)")), "bench/node_redlock.js failed: " .. out))
  end, version
end

-- The servers' CPU (INFO cpu, user + sys, seconds) summed over ports.
local function server_cpu(list)
  local sum = 0
  for _, port in ipairs(list) do
    local info = B.run("redis-cli -p " .. port .. " INFO cpu")
    sum = sum + tonumber(info:match("used_cpu_sys:([%d.]+)")) + tonumber(info:match("used_cpu_user:([%d.]+)"))
  end
  return sum
end

-- What a cycle costs in CPU (µs): the servers' (of used) and this process's.
local function cpu_per_cycle(opts, used)
  local client = redislock.new(opts)
  assert(assert(client:acquire("warm", 10)):release())
  local s0, c0 = server_cpu(used), os.clock()
  for _ = 1, N do assert(assert(client:acquire("bench", 10)):release()) end
  local server, own = (server_cpu(used) - s0) / N * 1e6, (os.clock() - c0) / N * 1e6
  client:close()
  return server, own
end

local ok, err = pcall(function()
  local urls = {}
  for i, p in ipairs(ports) do urls[i] = "redis://127.0.0.1:" .. p end
  local list = {
    { "single", B.cycles_on({ port = ports[1] }, N) },
    { "redlock", B.cycles_on({ redlock = urls }, N) },
  }
  local node, version = node_peer()
  if node then list[#list + 1] = { "node", node } else B.say("bench: node-redlock skipped (%s)", version) end
  local rates = B.slices(list, SLICES)
  local function median(name) return math.floor(B.percentile(rates[name], 50) + 0.5) end
  local note = string.format("median of %d slices of %d cycles", SLICES, N)
  B.emit({ name = "redlock.single/" .. id, value = median("single"), unit = "cycles/s", note = note,
           label = B.interp .. ": acquire+release, single-server client on one of the five" })
  local r, lo, hi = B.median_ratio(rates.redlock, rates.single)
  B.emit({ name = "redlock.five/" .. id, value = median("redlock"), unit = "cycles/s",
           baseline = "redlock.single/" .. id, baseline_value = median("single"), ratio = r, target = { ">=", 0.8 },
           note = string.format("%s; slice ratios %.2f-%.2f", note, lo, hi),
           label = B.interp .. ": acquire+release, Redlock over 5 servers, vs one server" })
  -- Where the time goes: CPU per cycle, servers' and client's (no target).
  local s1, c1 = cpu_per_cycle({ port = ports[1] }, { ports[1] })
  local s5, c5 = cpu_per_cycle({ redlock = urls }, ports)
  B.emit({ name = "redlock.cpu_single/" .. id, value = math.floor((s1 + c1) * 10 + 0.5) / 10, unit = "us/cycle",
           note = string.format("server %.1f + client %.1f (INFO cpu, os.clock; %d cycles)", s1, c1, N),
           label = B.interp .. ": CPU per acquire+release, one server" })
  B.emit({ name = "redlock.cpu_five/" .. id, value = math.floor((s5 + c5) * 10 + 0.5) / 10, unit = "us/cycle",
           note = string.format("servers %.1f (%.1f each) + client %.1f; %d cores", s5, s5 / 5, c5,
                                tonumber((B.run("nproc"):gsub("%s+$", ""))) or 0),
           label = B.interp .. ": CPU per acquire+release, Redlock over 5 servers" })
  if node then
    B.emit({ name = "redlock.node-redlock/" .. id, value = median("node"), unit = "cycles/s", note = note,
             label = "node-redlock " .. version .. " (ioredis), node " .. (B.run("node --version"):gsub("%s+$", ""))
               .. ": acquire+release over the same 5 servers" })
    r, lo, hi = B.median_ratio(rates.redlock, rates.node)
    B.emit({ name = "redlock.vs_node-redlock/" .. id, value = median("redlock"), unit = "cycles/s",
             baseline = "redlock.node-redlock/" .. id, baseline_value = median("node"), ratio = r,
             note = string.format("%s; slice ratios %.2f-%.2f", note, lo, hi),
             label = B.interp .. ": Redlock over 5 servers, vs node-redlock" })
  end
end)
B.stop_servers(pids, dir)
assert(ok, err)
