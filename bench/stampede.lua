-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): the cache-stampede guard of examples/openresty
-- (GET /report: when the cached report is missing, one request rebuilds it
-- in 0.2 s and the others wait for the lock "report", then read what it
-- built), on a private nginx with 2 workers and the example's own
-- configuration and handlers. ab keeps BENCH_STAMPEDE (3000) requests in
-- flight (-c N, 4 N in all) while the cache is full, and the entry expires
-- once the first N were answered, when every one of ab's connections has a
-- request in flight: they all miss it at once. (Starting with the cache
-- empty makes no stampede here: ab takes about as long to open its 3000
-- connections as the rebuild takes.) Then the same without the expiry (all
-- hits, no lock: the floor of the machine for that load, the load generator
-- included); N requests at once starting with the cache empty (ab -c N -n N:
-- few of them wait, see above) and the same with it full; and
-- BENCH_STAMPEDE_CAPPED (1000) in flight against Redis with
-- maxclients BENCH_STAMPEDE_MAXCLIENTS (64). Three ways, each on an nginx of
-- its own, BENCH_STAMPEDE_ROUNDS (3) rounds taken in turn:
--   coalesced      redislock, the waiters of a worker queued in the worker
--                  (the default)
--   not coalesced  redislock with coalesce = false (REDISLOCK_COALESCE=off):
--                  every waiting request waits on Redis itself
--   local lock     a lock in a shared dict, lua-resty-lock's way
--                  (bench/stampede_ngx.lua): one machine only, the floor
-- Redis connections are counted by polling INFO clients every 2 ms (the
-- poller's own connection left out), and the connections it refused
-- (rejected_connections) apart from the failed answers.
-- usage (from bench/run.sh): stampede.lua
local redislock = require("redislock")
local http = require("socket.http")
local socket = require("socket")
local B = require("benchlib")
local ngxlib = require("ngxlib")

local N = B.knob("BENCH_STAMPEDE", 3000)
local CAPPED = B.knob("BENCH_STAMPEDE_CAPPED", 1000)
local MAXCLIENTS = B.knob("BENCH_STAMPEDE_MAXCLIENTS", 64)
local ROUNDS = B.knob("BENCH_STAMPEDE_ROUNDS", 3)
local WORKERS = 2
local REBUILD = 0.2 -- seconds the example's rebuild takes (report.lua)
-- The example's client (examples/openresty/lua/redislock_examples/common.lua).
local POOL_SIZE, WAIT_CONNECTIONS = 16, 2

local redis = redislock.new({ port = B.port })

local function command(...)
  return assert(redis:command(...))
end

-- nginx.conf: the example's redislock.conf (a listen backlog of 4096, so
-- that the burst of connections is not dropped by the kernel and sent again
-- a second later) and, on a second port (second_port, set here), the
-- shared-dict lock's /report.
local second_port
local function conf_of(prefix, port)
  second_port = B.free_port()
  local root = B.root
  local example = assert(ngxlib.read_file(root .. "/examples/openresty/redislock.conf"))
  example = example:gsub("listen 127%.0%.0%.1:__PORT__;", "listen 127.0.0.1:" .. port .. " backlog=4096;")
  local f = assert(io.open(prefix .. "/conf/redislock.conf", "w"))
  f:write(example)
  f:close()
  return ngxlib.conf(prefix, {
    workers = WORKERS, worker_connections = 10000,
    main = "worker_rlimit_nofile 20000;\nenv REDIS_URL;\nenv REDISLOCK_COALESCE;",
    lua_path = root .. "/examples/openresty/lua/?.lua;",
    http = table.concat({
      "  include " .. ngxlib.quote(prefix .. "/conf/redislock.conf") .. ";",
      "  lua_shared_dict stampede_locks 1m;",
      "  server {",
      "    listen 127.0.0.1:" .. second_port .. " backlog=4096;", -- taken: start tries other ports
      "    location = /report { content_by_lua_block { require('stampede_ngx').handle() } }",
      "  }",
    }, "\n"),
  })
end

local function info(section, field)
  return tonumber(command("INFO", section):match(field .. ":(%d+)"))
end

-- The GETs Redis ran since the last CONFIG RESETSTAT.
local function gets()
  return tonumber(command("INFO", "commandstats"):match("cmdstat_get:calls=(%d+)")) or 0
end

-- n requests at a time to url, 4 n in all, the cache full; with expire, the
-- cache entry expires (is deleted) once the first n were answered, when every
-- connection of ab has a request in flight. Returns what ab and Redis said:
-- slowest (ms), failed (ab's failures and non-2xx answers), refused
-- (connections Redis refused), peak (Redis connections, the poller's left
-- out), calls (the commands Redis ran), rebuilds.
-- With empty, the cache is empty when ab starts, and n requests in all are
-- sent (the issue's first measure); with filled_once, the same with the
-- cache full: its floor.
local function burst(url, n, expire, empty, filled_once)
  command("DEL", "example:report", "example:report:rebuilds")
  if not empty then
    assert(os.execute("ab -q -n 1 " .. url .. " > /dev/null 2>&1"), "ab failed") -- the cache filled
    command("DEL", "example:report:rebuilds")
  end
  local total = (empty or filled_once) and n or 4 * n
  local out = os.tmpname()
  command("CONFIG", "RESETSTAT") -- the command and rejection counts start from 0
  local rejected = info("stats", "rejected_connections")
  os.execute(string.format("(ab -q -s 30 -c %d -n %d %s > %s 2>&1; echo ab-done >> %s) &", n, total, url, out, out))
  local peak, expired, text = 0, not expire
  repeat
    peak = math.max(peak, info("clients", "connected_clients") - 1)
    if not expired and gets() >= n then
      command("DEL", "example:report")
      expired = true
    end
    socket.sleep(0.002)
    text = ngxlib.read_file(out)
  until text and text:find("ab%-done\n$")
  os.remove(out)
  local complete = tonumber(text:match("Complete requests:%s*(%d+)"))
  local slowest = tonumber(text:match("100%%%s+(%d+)"))
  assert(complete and slowest, "ab said: " .. text)
  -- ab's "Length" failures are answers of another length than the first
  -- one's: reports built at other times, not failures.
  local connect, receive, exceptions = text:match("Connect: (%d+), Receive: (%d+), Length: %d+, Exceptions: (%d+)")
  local why = { ab = (tonumber(connect) or 0) + (tonumber(receive) or 0) + (tonumber(exceptions) or 0)
                     + (total - complete),
                non2xx = tonumber(text:match("Non%-2xx responses:%s*(%d+)")) or 0,
                refused = info("stats", "rejected_connections") - rejected }
  local failed = why.ab + why.non2xx
  if failed + why.refused > 0 then
    B.say("bench: %d failed: %d by ab, %d not 2xx; %d connections refused by Redis", failed, why.ab, why.non2xx,
          why.refused)
  end
  -- The commands the requests cost Redis: all but the poller's.
  local calls = 0
  for name, k in command("INFO", "commandstats"):gmatch("cmdstat_([%w|_]+):calls=(%d+)") do
    if name ~= "info" and name ~= "config" and name ~= "del" then calls = calls + tonumber(k) end
  end
  return { slowest = slowest, failed = failed, refused = why.refused, peak = peak, calls = calls,
           rebuilds = tonumber(redis:command("GET", "example:report:rebuilds")) or 0 }
end

local WAYS = {
  { id = "coalesced", label = "redislock, waiters coalesced per worker", path = "/report", env = "" },
  { id = "not_coalesced", label = "redislock, coalesce = false", path = "/report", env = "REDISLOCK_COALESCE=off" },
  { id = "local_lock", label = "a shared-dict lock (lua-resty-lock's way), one machine", path = "/report",
    env = "", second_port = true },
}

-- One round of one way: a fresh nginx; the stampede, the same warm; N
-- requests starting with the cache empty, the same with it full; the
-- stampede against maxclients.
local function round(way)
  local port, pid, prefix = ngxlib.start(conf_of, "REDIS_URL=redis://127.0.0.1:" .. B.port .. " " .. way.env)
  local r = {}
  local ok, err = pcall(function()
    local url = string.format("http://127.0.0.1:%d%s", way.second_port and second_port or port, way.path)
    r.cold = burst(url, N, true)
    if way.path == "/report" and not way.second_port then -- the example's observer (GET /metrics)
      local m = http.request(string.format("http://127.0.0.1:%d/metrics", port)) or ""
      r.sections = tonumber(m:match('event="acquired",kind="lock"} (%d+)'))
      r.held = tonumber(m:match('redislock_hold_seconds_total{kind="lock"} ([%d.e+-]+)'))
    end
    r.warm = burst(url, N, false)
    r.empty = burst(url, N, false, true)
    r.empty_warm = burst(url, N, false, false, true)
    command("CONFIG", "SET", "maxclients", tostring(MAXCLIENTS))
    r.capped = burst(url, CAPPED, true)
  end)
  redis:command("CONFIG", "SET", "maxclients", "10000")
  local log = ngxlib.read_file(prefix .. "/logs/error.log") or ""
  ngxlib.stop(pid, prefix)
  if not ok then error(err .. "\n" .. log, 0) end
  return r
end

local results = {}
for _, way in ipairs(WAYS) do results[way.id] = {} end
for _ = 1, ROUNDS do
  for _, way in ipairs(WAYS) do
    local r = round(way)
    table.insert(results[way.id], r)
    B.say("bench: stampede %s: %d requests, slowest %d ms (warm %d ms), %d failed, %d rebuilds, peak %d"
          .. " connections, %d Redis commands (warm %d); %d against maxclients %d: %d failed, peak %d",
          way.id, N, r.cold.slowest, r.warm.slowest, r.cold.failed, r.cold.rebuilds, r.cold.peak, r.cold.calls,
          r.warm.calls, CAPPED, MAXCLIENTS, r.capped.failed, r.capped.peak)
  end
end

-- The median of field f of part p over the rounds; the highest; the sum.
local function median(list, p, f)
  local xs = {}
  for i, r in ipairs(list) do xs[i] = r[p][f] end
  return B.percentile(xs, 50)
end
local function most(list, p, f)
  local m = 0
  for _, r in ipairs(list) do m = math.max(m, p and r[p][f] or r[f] or 0) end
  return m
end
local function sum(list, p, f)
  local s = 0
  for _, r in ipairs(list) do s = s + r[p][f] end
  return s
end

local bound = WORKERS * (POOL_SIZE + WAIT_CONNECTIONS)
local note = string.format("ab -c %d -n %d, %d nginx workers, %d rounds", N, N, WORKERS, ROUNDS)
local warm_id = "stampede.warm"
local warm = {}
for _, way in ipairs(WAYS) do
  for _, r in ipairs(results[way.id]) do warm[#warm + 1] = r.warm.slowest end
end
B.emit({ name = warm_id, value = B.percentile(warm, 50), unit = "ms", note = note,
         label = string.format("slowest answer, cache full (all hits, no lock), %d requests", N) })
for _, way in ipairs(WAYS) do
  local list = results[way.id]
  local id = "stampede." .. way.id
  local redislock_way = way.id ~= "local_lock"
  B.emit({ name = id .. ".slowest", value = median(list, "cold", "slowest"), unit = "ms", note = note,
           baseline = warm_id, baseline_value = B.percentile(warm, 50),
           label = string.format("slowest answer, %s, %d requests, cache empty", way.label, N) })
  -- The targets are the default way's; the others are there to compare.
  local default = way.id == "coalesced"
  B.emit({ name = id .. ".empty_slowest", value = median(list, "empty", "slowest"), unit = "ms",
           baseline = id .. ".empty_warm", baseline_value = median(list, "empty_warm", "slowest"),
           note = string.format("ab -c %d -n %d, the cache empty at the start, %d rounds", N, N, ROUNDS),
           label = string.format("slowest answer, %s, %d requests, the cache empty at the start (ratio: to the same"
                                 .. " with it full)", way.label, N) })
  B.emit({ name = id .. ".empty_warm", value = median(list, "empty_warm", "slowest"), unit = "ms",
           note = string.format("ab -c %d -n %d, the cache full, %d rounds", N, N, ROUNDS),
           label = string.format("slowest answer, %s, %d requests, the cache full", way.label, N) })
  B.emit({ name = id .. ".failed", value = sum(list, "cold", "failed"), unit = "requests", note = note,
           target = default and { "==", 0 } or nil,
           label = string.format("failed answers, %s (all rounds)", way.label) })
  B.emit({ name = id .. ".rebuilds", value = most(list, "cold", "rebuilds"), unit = "rebuilds", note = note,
           target = { "==", 1 }, label = string.format("rebuilds per stampede, %s (most)", way.label) })
  B.emit({ name = id .. ".peak", value = most(list, "cold", "peak"), unit = "connections", note = note,
           target = redislock_way and { "<=", bound } or nil,
           label = string.format("peak Redis connections, %s (target: workers x (pool_size + %d) = %d)",
                                 way.label, WAIT_CONNECTIONS, bound) })
  if list[1].sections then
    local ms = {}
    -- The filling request and the stampede each rebuilt once.
    for i, r in ipairs(list) do ms[i] = (r.held - 2 * REBUILD) / (r.sections - 2) * 1000 end
    B.emit({ name = id .. ".section", value = B.percentile(ms, 50), unit = "ms", note = note,
             label = string.format("the time one section held the lock, %s (the rebuild's left out; from the"
                                   .. " example's observer, GET /metrics)", way.label) })
    local n, held = {}, {}
    for i, r in ipairs(list) do n[i], held[i] = r.sections - 1, r.held - REBUILD end
    B.emit({ name = id .. ".sections", value = B.percentile(n, 50), unit = "sections", note = note,
             label = string.format("sections per stampede (the filling request's left out), %s", way.label) })
    B.emit({ name = id .. ".held", value = B.percentile(held, 50) * 1000, unit = "ms", note = note,
             label = string.format("the lock held in all, one section after another (the filling request's"
                                   .. " left out), %s", way.label) })
  end
  B.emit({ name = id .. ".commands", value = median(list, "cold", "calls"), unit = "commands", note = note,
           label = string.format("Redis commands per stampede, %s (%d answered from the cache when warm)",
                                 way.label, N) })
  B.emit({ name = id .. ".capped_failed", value = sum(list, "capped", "failed"), unit = "requests",
           target = default and { "==", 0 } or nil,
           note = string.format("ab -c %d -n %d, maxclients %d, %d rounds", CAPPED, CAPPED, MAXCLIENTS, ROUNDS),
           label = string.format("failed answers against maxclients %d, %s", MAXCLIENTS, way.label) })
  B.emit({ name = id .. ".capped_refused", value = sum(list, "capped", "refused"), unit = "connections",
           target = default and { "==", 0 } or nil,
           note = string.format("ab -c %d -n %d, maxclients %d, %d rounds", CAPPED, CAPPED, MAXCLIENTS, ROUNDS),
           label = string.format("connections Redis refused (maxclients %d), %s", MAXCLIENTS, way.label) })
end
