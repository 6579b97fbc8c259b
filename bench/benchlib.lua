-- SPDX-License-Identifier: MIT
-- Shared by the bench/ scripts (benchmarks, not tests): the machine-readable
-- result line, percentiles, RESP bytes, shell helpers. Runs under Lua 5.4 and
-- LuaJIT; bench/run.sh puts bench/ on LUA_PATH.
local core = require("redislock.core")

local M = {}

M.now = core.now
M.port = assert(tonumber(os.getenv("REDIS_PORT")), "REDIS_PORT is not set (run through bench/run.sh)")
M.interp = jit and "LuaJIT" or "Lua 5.4"  -- luacheck: ignore (jit is LuaJIT's)
M.lua = jit and "luajit" or "lua5.4"      -- luacheck: ignore
M.root = os.getenv("BENCH_ROOT") or "."

--- Quotes s for sh.
function M.sh_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

--- Runs a shell command; returns its output (stderr included) and whether it
-- exited 0. The exit status travels as a last line, since LuaJIT's popen close
-- does not report it.
function M.run(cmd)
  local p = assert(io.popen("(" .. cmd .. ") 2>&1; echo __EXIT:$?"))
  local out = p:read("*a")
  p:close()
  local code = tonumber(out:match("__EXIT:(%d+)\n?$"))
  return (out:gsub("__EXIT:%d+\n?$", "")), code == 0
end

--- A knob from the environment: a positive number, else the default.
function M.knob(name, default)
  local v = tonumber(os.getenv(name) or "")
  if v and v > 0 then return v end
  return default
end

--- The p-th percentile (0..100) of a list of numbers (nearest rank).
function M.percentile(list, p)
  local sorted = {}
  for i, v in ipairs(list) do sorted[i] = v end
  table.sort(sorted)
  local rank = math.max(1, math.ceil(p / 100 * #sorted))
  return sorted[rank]
end

--- The arguments of one RESP command (an array of bulk strings), as a list.
function M.resp_args(bytes)
  local n, pos = bytes:match("^%*(%d+)\r\n()")
  local args = {}
  for i = 1, assert(tonumber(n), "not a RESP command") do
    local len, p = bytes:match("^%$(%d+)\r\n()", pos)
    len = assert(tonumber(len), "not a RESP bulk string")
    args[i] = bytes:sub(p, p + len - 1)
    pos = p + len + 2
  end
  return args
end

--- Writes s to a new temporary file; returns its path.
function M.temp_file(s)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
  return path
end

--- The resident set size of this process, in KiB (/proc/self/statm).
function M.rss_kib()
  local f = assert(io.open("/proc/self/statm"))
  local _, resident = f:read("*n", "*n")
  f:close()
  return math.floor(resident * M.page_kib)
end
M.page_kib = (tonumber((M.run("getconf PAGESIZE"))) or 4096) / 1024

--- Whether Client:acquire takes the option wait_mode = mode ("notify",
-- "poll"), or fair = true when mode is "fair". Older code refuses unknown
-- options with an argument error before any I/O.
function M.supports(client, mode)
  local opts = M.wait_opts(mode, 0)
  local ok, lock = pcall(client.acquire, client, "bench:probe", 1, opts)
  if ok and lock then lock:release() end
  return ok
end

--- The acquire options for a waiting mode: "notify", "poll", "fair",
-- "wake" (notify without the handoff: woken, the waiter tries), or
-- "default" (no mode option: what the code of the day does).
function M.wait_opts(mode, wait)
  if mode == "fair" then return { wait = wait, fair = true } end
  if mode == "default" then return { wait = wait } end
  if mode == "wake" then return { wait = wait, handoff = false } end
  return { wait = wait, wait_mode = mode }
end

--- How a report names a waiting mode.
function M.mode_label(mode)
  if mode == "default" then return "waiting as the API does today" end
  if mode == "fair" then return "fair = true" end
  if mode == "wake" then return "handoff = false" end
  return "wait_mode = \"" .. mode .. "\""
end

--- The waiting modes to compare: notify and poll when the API has them,
-- fair too when it has that; else "default" alone.
function M.wait_modes(client)
  local modes = {}
  for _, m in ipairs({ "notify", "wake", "poll", "fair" }) do
    if M.supports(client, m) then modes[#modes + 1] = m end
  end
  if #modes == 0 then modes[1] = "default" end
  return modes
end

local function fmt_value(v)
  if type(v) ~= "number" then return tostring(v) end
  if v == math.floor(v) and math.abs(v) < 1e15 then return string.format("%d", v) end
  return string.format("%.4g", v)
end

--- Measures in slices: each of list ({ name, fn } pairs; fn() -> a rate) runs
-- once per slice, in an order that rotates from slice to slice, `slices`
-- times. Returns rates[name] = the list of its rates, one per slice. On a
-- small virtual machine the loopback rate swings by 2x from one second to
-- the next; figures taken in the same slice see the same conditions, so
-- ratios are taken slice by slice (median_ratio).
function M.slices(list, slices)
  local rates = {}
  for _, m in ipairs(list) do rates[m[1]] = {} end
  for s = 1, slices do
    for k = 0, #list - 1 do
      local m = list[(s + k - 1) % #list + 1]
      local r = rates[m[1]]
      r[#r + 1] = m[2]()
    end
  end
  return rates
end

--- The median over slices of a[i] / b[i], and the lowest and highest.
function M.median_ratio(a, b)
  local r = {}
  for i = 1, #a do r[i] = a[i] / b[i] end
  return M.percentile(r, 50), M.percentile(r, 0), M.percentile(r, 100)
end

--- Prints one machine-readable line for one figure:
--   bench name=<id> value=<number> unit=<unit> [baseline=<id> baseline_value=<n>
--   ratio=<value/baseline>] [target=<op><n> met=yes|no] label="<text>"
-- f: name, value, unit, label, and optionally baseline, baseline_value,
-- ratio (when not value / baseline_value, e.g. a median of ratios), target
-- ({ op, n }: op is ">=", "<=" or "=="; the ratio is compared when there is a
-- baseline, else the value), target_of ("value" to compare the value even
-- with a baseline), met (false fails the target whatever the numbers), note.
function M.emit(f)
  local parts = { "bench", "name=" .. f.name, "value=" .. fmt_value(f.value), "unit=" .. f.unit }
  local ratio
  if f.baseline then
    parts[#parts + 1] = "baseline=" .. f.baseline
    parts[#parts + 1] = "baseline_value=" .. fmt_value(f.baseline_value)
    ratio = f.ratio or f.value / f.baseline_value
    parts[#parts + 1] = string.format("ratio=%.3f", ratio)
  end
  if f.target then
    local op, n = f.target[1], f.target[2]
    local x = (ratio and f.target_of ~= "value") and ratio or f.value
    local met = (op == ">=" and x >= n) or (op == "<=" and x <= n) or (op == "==" and x == n)
    if f.met ~= nil then met = met and f.met end
    parts[#parts + 1] = "target=" .. op .. fmt_value(n)
    parts[#parts + 1] = "met=" .. (met and "yes" or "no")
  end
  if f.note then parts[#parts + 1] = string.format("note=%q", f.note) end
  parts[#parts + 1] = string.format("label=%q", f.label)
  print(table.concat(parts, " "))
  io.stdout:flush()
end

--- The rate a benchmark's child process printed on its cycles_per_s line,
-- and the cycles it ran before it started its clock (its warm= field; 0
-- when it prints none); raises, naming what, when the child failed.
function M.child_rate(what, cmd)
  local out, ok = M.run(cmd)
  local rate = ok and tonumber(out:match("cycles_per_s=([%d.]+)"))
  return (assert(rate, what .. " failed: " .. out)), tonumber(out:match("warm=(%d+)")) or 0
end

-- A floor (build/bench/floor, bench/floor.c) of the two commands in f's
-- fields first and second, what naming it in errors, the first answered
-- with replies replies: f with files (the two files that hold them),
-- :rate(n[, socket]) (cycles per second over n cycles; socket "library":
-- the floor's socket set up as the library's, FLOOR_SOCKET in
-- bench/floor.c) and :close().
local function floor_of(f, what, replies)
  local files = { M.temp_file(f.first), M.temp_file(f.second) }
  f.files = files
  function f.rate(_, n, socket)
    local env = socket and "FLOOR_SOCKET=" .. socket .. " " or ""
    return (M.child_rate(what, env .. table.concat({ M.root .. "/build/bench/floor", M.port, n,
                                                      files[1], files[2], replies }, " ")))
  end
  function f.close()
    for _, path in ipairs(files) do os.remove(path) end
  end
  return f
end

--- The raw floor for client's lock cycle: the exact bytes the library
-- sends for an uncontended acquire (a take: MULTI, SET NX PX, XADD of the
-- slot's fence record, EXEC) and release of key (ttl in seconds), with a
-- token as the library makes it. A floor (floor_of: :rate(n[, socket]),
-- :close(), files) with the fields acquire and release (the bytes).
function M.floor(client, key, ttl)
  local tok = require("redislock.hold").new_token(client) -- the holder's part too, as the library's
  local acquire = core.encode_script("take", key, tok, ttl * 1000, client.prefix)
  local release = core.encode_script("release", key, tok, nil, client.prefix)
  -- A take is answered with 4 replies (MULTI's, 2 QUEUED, EXEC's).
  return floor_of({ first = acquire, second = release, acquire = acquire, release = release }, "bench/floor", 4)
end

--- The minimal lock a user compares with: SET key token NX PX ttl
-- (seconds), then the usual compare-and-delete script by EVALSHA (no
-- fence, no waking, no fairness), on the key "minimal"; client (any with
-- :command) loads the script. A floor (floor_of) with the fields token and
-- sha (the script's), for other clients of the same commands.
function M.minimal(client, ttl)
  local cad = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
  local token, sha = core.token(), assert(client:command("SCRIPT", "LOAD", cad))
  return floor_of({ first = core.encode("SET", "minimal", token, "NX", "PX", ttl * 1000),
                    second = core.encode("EVALSHA", sha, 1, "minimal", token), token = token, sha = sha },
                  "bench/floor (minimal lock)", 1)
end

--- The pure-Lua minimal lock a user would write instead
-- (bench/pure_lua.lua: Debian's lua5.3 with lua-redis), when installed:
-- a function of n that runs it in a process of its own and returns its
-- rate and warm-up cycles (child_rate's); nil, said once, when not.
function M.pure_lua()
  local _, has = M.run("lua5.3 -e 'require \"redis\"'")
  if not has then
    M.say("bench: no lua5.3 with lua-redis (sh tools/deps.sh bench installs them): the pure-Lua lock is skipped")
    return nil
  end
  return function(n)
    local cmd = table.concat({ "lua5.3", M.root .. "/bench/pure_lua.lua", M.port, n }, " ")
    return M.child_rate("bench/pure_lua.lua", cmd)
  end
end

--- The placement bench/run.sh names as a script's first argument
-- ("unpinned" when run alone), the id its result lines carry
-- ("lua5.4/<placement>") and the label's prefix ("Lua 5.4, <placement>").
M.placement = (rawget(_G, "arg") or {})[1] or "unpinned"
M.id = M.lua .. "/" .. M.placement
M.where = M.interp .. ", " .. M.placement

--- Starts redis-servers of a bench's own, daemonized, in dir: one per
-- entry of servers, { port = n, args = "more redis-server arguments" },
-- each with its pid and log files in dir, pinned to core BENCH_SERVER_CPU
-- (0) when pin is true. Waits until each answers PING; returns their PIDs.
function M.start_servers(dir, servers, pin)
  local pids = {}
  for i, s in ipairs(servers) do
    local out, ok = M.run(table.concat({ "cd", M.sh_quote(dir), "&& redis-server --bind 127.0.0.1 --port", s.port,
      s.args or "", "--save '' --appendonly no --daemonize yes --pidfile", dir .. "/redis" .. i .. ".pid",
      "--logfile", dir .. "/redis" .. i .. ".log" }, " "))
    assert(ok, "redis-server did not start: " .. out)
  end
  for i, s in ipairs(servers) do
    for _ = 1, 200 do
      local f = io.open(dir .. "/redis" .. i .. ".pid")
      pids[i] = f and tonumber(f:read("*a"))
      if f then f:close() end
      if pids[i] and M.run("redis-cli -p " .. s.port .. " PING"):find("PONG", 1, true) then break end
      core.sleep(0.02)
    end
    assert(pids[i], "redis-server did not start")
    if pin then M.run("taskset -apc " .. (os.getenv("BENCH_SERVER_CPU") or "0") .. " " .. pids[i] .. " >/dev/null") end
  end
  return pids
end

--- Stops the servers start_servers started (by PID), and removes dir.
function M.stop_servers(pids, dir)
  for _, pid in ipairs(pids) do os.execute("kill " .. pid .. " 2>/dev/null") end
  for _, pid in ipairs(pids) do
    for _ = 1, 100 do
      if not io.open("/proc/" .. pid .. "/stat") then break end
      core.sleep(0.05)
    end
  end
  os.execute("rm -rf " .. M.sh_quote(dir))
end

--- A measure for M.slices: n calls of once() (which raises when a call
-- fails), after one call to warm up (scripts loaded, connection made);
-- returns calls per second.
function M.rate(n, once)
  once()
  return function()
    local t0 = core.now()
    for _ = 1, n do once() end
    return n / (core.now() - t0)
  end
end

--- A measure for M.slices: n uncontended acquire+release cycles of a new
-- client made with opts (warmed up once); returns cycles per second.
function M.cycles_on(opts, n)
  local client = require("redislock").new(opts)
  return M.rate(n, function() assert(assert(client:acquire("bench", 10)):release()) end)
end

--- A loopback port nobody listens on right now (the kernel's pick).
function M.free_port()
  local s = assert(require("socket").bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return tonumber(port)
end

--- Prints a progress line on stderr (the report is built from stdout).
function M.say(fmt, ...)
  io.stderr:write(string.format(fmt, ...), "\n")
end

return M
