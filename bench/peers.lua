-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): redislock side by side with the peers installable
-- here, on the same server, single client, uncontended acquire+release cycles
-- per second, each beside the raw floor (bench/floor.c with redislock's bytes),
-- in BENCH_PEER_SLICES (9) slices of BENCH_CYCLES (4000) cycles each, taken in
-- turn (benchlib's slices); rates are medians, ratios medians of the ratios
-- within a slice:
--  * Debian's python3-redis Lock (bench/redis_py.py, /usr/bin/python3) vs
--    redislock under Lua 5.4 in this process;
--  * Debian's lua-resty-redis in nginx (SET NX PX + compare-and-delete EVAL,
--    per request: connect from the pool ... set_keepalive; and on one
--    connection) vs redislock in the same nginx (bench/ngx_bench.lua); and
--    one cycle per request under concurrency, as an application does (ab
--    -c BENCH_AB_CONCURRENCY (16) -k, BENCH_AB_REQUESTS (20000) requests per
--    slice), when ab (apache2-utils) is installed.
-- The private nginx runs from a temporary prefix with the lua module, on a
-- free loopback port, and is stopped by its PID (kill -QUIT).
-- usage (from bench/run.sh, pinned by taskset): peers.lua <placement name>
local redislock = require("redislock")
local http = require("socket.http")
local B = require("benchlib")
local ngxlib = require("ngxlib")

local PLACEMENT = arg[1] or "unpinned"
local N = B.knob("BENCH_CYCLES", 4000)
local SLICES = B.knob("BENCH_PEER_SLICES", 9)
local PYTHON = "/usr/bin/python3"

local client = redislock.new({ port = B.port })
local floor = B.floor(client, "bench", 10)

local function cycles(n)
  local t0 = B.now()
  for _ = 1, n do
    local lock = assert(client:acquire("bench", 10))
    assert(lock:release())
  end
  return n / (B.now() - t0)
end

local slices_note = string.format("median of %d slices of %d cycles", SLICES, N)

-- The median rate of rates[name].
local function median(rates, name)
  return math.floor(B.percentile(rates[name], 50) + 0.5)
end

-- Emits rates[a] with rates[b] (named base_name) as its baseline; notes
-- rates[a] against rates.floor too when b is not the floor.
local function emit_rate(rates, a, b, name, base_name, label)
  local r, lo, hi = B.median_ratio(rates[a], rates[b])
  local note = string.format("%s; slice ratios %.2f-%.2f", slices_note, lo, hi)
  if b ~= "floor" then
    note = string.format("%s; %.2f of the raw floor", note, (B.median_ratio(rates[a], rates.floor)))
  end
  B.emit({ name = name, value = median(rates, a), unit = "cycles/s", baseline = base_name,
           baseline_value = median(rates, b), ratio = r, note = note, label = label })
end

------------------------------------------------------------------------------
-- redis-py

local function python_cycles()
  local cmd = table.concat({ PYTHON, B.root .. "/bench/redis_py.py", "cycles", B.port, N }, " ")
  return (B.child_rate("bench/redis_py.py", cmd))
end

local _, has_redis_py = B.run(PYTHON .. " -c 'import redis'")
cycles(1000)
floor:rate(1000)
local id = "/" .. PLACEMENT
if has_redis_py then
  python_cycles() -- warm up: loads its release script
  local rates = B.slices({ { "floor", function() return floor:rate(N) end }, { "lua", function() return cycles(N) end },
                           { "py", python_cycles } }, SLICES)
  local version = (B.run(PYTHON .. " -c 'import redis; print(redis.__version__)'")):gsub("%s+$", "")
  B.emit({ name = "peer.floor.raw" .. id, value = median(rates, "floor"), unit = "cycles/s", note = slices_note,
           label = "raw floor beside redis-py, " .. PLACEMENT })
  emit_rate(rates, "lua", "floor", "peer.redislock/lua5.4" .. id, "peer.floor.raw" .. id,
            "redislock (Lua 5.4, " .. PLACEMENT .. ")")
  emit_rate(rates, "py", "lua", "peer.redis-py" .. id, "peer.redislock/lua5.4" .. id,
            "redis-py " .. version .. " Lock (/usr/bin/python3, " .. PLACEMENT .. ")")
else
  B.say("bench: no redis-py for %s (sh tools/deps.sh bench installs python3-redis): skipped", PYTHON)
end

------------------------------------------------------------------------------
-- nginx: redislock over cosockets vs lua-resty-redis

local function nginx_conf(prefix, port)
  return ngxlib.conf(prefix, { http = table.concat({
    "  server {",
    "    listen 127.0.0.1:" .. port .. ";",
    "    location / { content_by_lua_block { require('ngx_bench').handle(" .. B.port .. ") } }",
    "  }",
  }, "\n") })
end

local port, pid, prefix = ngxlib.start(nginx_conf)
local ok, err = pcall(function()
  local function get(path)
    return function()
      local body, code = http.request(string.format("http://127.0.0.1:%d/%s?n=%d", port, path, N))
      local rate = code == 200 and tonumber(body:match("cycles_per_s=([%d.]+)"))
      return (assert(rate, path .. " in nginx failed (" .. tostring(code) .. "): " .. tostring(body)
                                .. (ngxlib.read_file(prefix .. "/logs/error.log") or "")))
    end
  end
  for _, path in ipairs({ "redislock", "resty", "resty-one" }) do -- warm up: connections, scripts
    http.request(string.format("http://127.0.0.1:%d/%s?n=1000", port, path))
  end
  local rates = B.slices({ { "floor", function() return floor:rate(N) end }, { "ngx", get("redislock") },
                           { "resty", get("resty") }, { "resty_one", get("resty-one") } }, SLICES)
  local where = " (nginx, 1 worker, " .. PLACEMENT .. ")"
  local floor_id, ngx_id = "peer.floor.raw.nginx" .. id, "peer.redislock/nginx" .. id
  B.emit({ name = floor_id, value = median(rates, "floor"), unit = "cycles/s", note = slices_note,
           label = "raw floor beside nginx, " .. PLACEMENT })
  emit_rate(rates, "ngx", "floor", ngx_id, floor_id, "redislock over cosockets" .. where)
  emit_rate(rates, "resty", "ngx", "peer.resty/nginx" .. id, ngx_id,
            "lua-resty-redis 0.27, pooled connect per cycle" .. where)
  emit_rate(rates, "resty_one", "ngx", "peer.resty-one/nginx" .. id, ngx_id,
            "lua-resty-redis 0.27, one connection" .. where)

  -- One cycle per request, concurrent requests (requests/s from ab).
  local _, has_ab = B.run("command -v ab")
  if not has_ab then
    B.say("bench: no ab (sh tools/deps.sh bench installs apache2-utils): per-request figures skipped")
    return
  end
  local conc, reqs = B.knob("BENCH_AB_CONCURRENCY", 16), B.knob("BENCH_AB_REQUESTS", 20000)
  local function ab(path)
    return function()
      local out = B.run(string.format("ab -q -k -c %d -n %d http://127.0.0.1:%d/%s 2>&1", conc, reqs, port, path))
      local rps = tonumber(out:match("Requests per second:%s*([%d.]+)"))
      local failed = tonumber(out:match("Failed requests:%s*(%d+)"))
      local non2xx = out:match("Non%-2xx responses:%s*(%d+)")
      assert(rps and failed == 0 and not non2xx, path .. ": ab said: " .. out)
      return rps
    end
  end
  ab("redislock-req")() -- warm up: pool connections
  ab("resty-req")()
  local per = B.slices({ { "ngx", ab("redislock-req") }, { "resty", ab("resty-req") } }, 5)
  local r, lo, hi = B.median_ratio(per.resty, per.ngx)
  local req_id = "peer.redislock-req/nginx" .. id
  B.emit({ name = req_id, value = median(per, "ngx"), unit = "requests/s",
           note = string.format("ab -k -c %d, median of 5 slices of %d requests", conc, reqs),
           label = "redislock, one cycle per request, concurrent" .. where })
  B.emit({ name = "peer.resty-req/nginx" .. id, value = median(per, "resty"), unit = "requests/s",
           baseline = req_id, baseline_value = median(per, "ngx"), ratio = r, target = { "<=", 1.0 },
           note = string.format("slice ratios %.2f-%.2f", lo, hi),
           label = "lua-resty-redis 0.27, one cycle per request, concurrent" .. where })
end)
ngxlib.stop(pid, prefix)
floor:close()
if not ok then error(err, 0) end
