-- SPDX-License-Identifier: MIT
-- Prints the table a person reads from the `bench ...` lines the other bench/
-- scripts wrote (bench/benchlib.lua's emit), then those lines themselves, for
-- machines. Lines that are not results pass through as notes.
-- usage: report.lua <results file>
local path = assert(arg[1], "usage: report.lua <results file>")

local SECTIONS = {
  { "Uncontended acquire+release, one client (ratio to the floor of the same run and placement)",
    { "floor.raw/", "floor.redis-benchmark/", "cycle/", "with_lock/", "wire/" } },
  { "Against the minimal lock a user compares with (SET NX PX + compare-and-delete), same run and placement",
    { "floor.minimal/", "cycle.vs_minimal/", "server_cpu/", "peer.pure-lua/", "cycle.vs_pure_lua/" } },
  { "Where a cycle's time goes (bench/split.lua): each client in a process of its own, then step by step",
    { "split." } },
  { "TLS: the same cycle over verified TLS, and new connections", { "cycle.plain/", "cycle.tls/", "connect." } },
  { "Redis Cluster: the same cycle through cluster routing, on one node", { "cycle.single_node/", "cycle.cluster/" } },
  { "Semaphore, read-write lock, multi-key lock: their cycle vs the lock's (same run and placement)",
    { "prim." } },
  { "Redlock over 5 servers of its own (no persistence), client unpinned", { "redlock." } },
  { "Handoff latency: release to the next holder (ratio to a PING round trip)", { "rtt.", "handoff." } },
  { "Contended throughput, one key (mutual-exclusion violations must be 0)",
    { "contended/", "contended.", "violations/" } },
  { "OpenResty under a stampede: examples/openresty's GET /report, 2 nginx workers", { "stampede." } },
  { "Memory: client RSS over many cycles", { "rss." } },
  { "Peers on the same server, one client", { "peer." } },
}

-- A result line as a table of its fields: key=value, or key="text" with
-- backslash escapes (as %q writes them).
local function parse(line)
  local f, pos = {}, #"bench " + 1
  while true do
    local k, p = line:match("^%s*([%w_]+)=()", pos)
    if not k then break end
    if line:sub(p, p) == '"' then
      local buf, q = {}, p + 1
      while q <= #line and line:sub(q, q) ~= '"' do
        if line:sub(q, q) == "\\" then q = q + 1 end
        buf[#buf + 1] = line:sub(q, q)
        q = q + 1
      end
      f[k], pos = table.concat(buf), q + 1
    else
      f[k], pos = line:match("^(%S*)()", p)
    end
  end
  return f
end

-- 1234567 -> "1,234,567"; fractions keep 3 significant digits.
local function num(s)
  local n = tonumber(s)
  if not n then return s or "" end
  if n ~= math.floor(n) then return string.format("%.3g", n) end
  local text = string.format("%d", n)
  repeat
    local k
    text, k = text:gsub("^(-?%d+)(%d%d%d)", "%1,%2")
  until k == 0
  return text
end

local results, other, lines = {}, {}, {}
for line in io.lines(path) do
  if line:match("^bench ") then
    local f = parse(line)
    f.line = line
    results[#results + 1] = f
  elseif line ~= "" then
    other[#other + 1] = line
  end
end

-- A ratio with about three significant digits.
local function ratio(s)
  local r = tonumber(s)
  if not r then return "" end
  return string.format(r >= 100 and "%.0f" or r >= 10 and "%.1f" or "%.2f", r)
end

local function row(f)
  local target = f.target and (f.target .. " " .. (f.met == "yes" and "met" or "MISSED")) or ""
  lines[#lines + 1] = string.format("  %-74s %11s %-14s %11s %7s  %s", f.label or f.name, num(f.value), f.unit,
                                    num(f.baseline_value), ratio(f.ratio), target)
  if f.note then lines[#lines + 1] = string.format("  %-74s (%s)", "", f.note) end
end

local shown = {}
lines[#lines + 1] = string.format("  %-74s %11s %-14s %11s %7s  %s", "figure", "value", "unit", "baseline",
                                  "ratio", "target")
for _, section in ipairs(SECTIONS) do
  local title, prefixes = section[1], section[2]
  local header = false
  for i, f in ipairs(results) do
    for _, p in ipairs(prefixes) do
      if not shown[i] and f.name:sub(1, #p) == p then
        if not header then
          lines[#lines + 1] = ""
          lines[#lines + 1] = title
          header = true
        end
        row(f)
        shown[i] = true
      end
    end
  end
end
for i, f in ipairs(results) do
  if not shown[i] then row(f) end
end

local met, missed = 0, {}
for _, f in ipairs(results) do
  if f.met == "yes" then met = met + 1 elseif f.met == "no" then missed[#missed + 1] = f.name end
end

print("Ratios are to the baseline in the same run; where rates were taken in slices, the ratio is the median")
print("of the ratios within a slice (the loopback rate can swing 2x between slices), not of the medians.")
print()
print(table.concat(lines, "\n"))
print()
for _, line in ipairs(other) do print(line) end
print(string.format("targets: %d met, %d missed%s", met, #missed,
                    #missed > 0 and (" (" .. table.concat(missed, ", ") .. ")") or ""))
print()
print("machine-readable, one line per figure:")
for _, f in ipairs(results) do print(f.line) end
