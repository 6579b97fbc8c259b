-- SPDX-License-Identifier: MIT
-- make torture: with_lock under injected faults, checked afterwards (Jepsen's
-- way: record a history, then read it). Not a test of `make test`.
--
-- A phase per topology (TORTURE_TOPOLOGY=single|sentinel|cluster|redlock|all,
-- or a list: sentinel,redlock; default single), each with the same workload
-- and checker:
--  * single: one lock server (appendonly yes, appendfsync always, so that
--    locks and fences survive its restarts), on an address of its own
--    (127.0.0.41) when run.sh could make a network namespace: its link to
--    the clients is then cut, and made lossy (a share of the packets
--    dropped: TCP resends them late; tc's netem, which would delay them,
--    is not in every kernel);
--  * sentinel: a master, two replicas and three sentinels
--    (torture/sentinel.lua), partitions included when run.sh could make a
--    network namespace;
--  * cluster: three masters with a replica each (torture/cluster.lua):
--    partitions, failovers (automatic and asked for), slot moves, pauses;
--  * redlock: five servers (torture/redlock.lua): partitions, restarts
--    without data, pauses, clocks jumped forward.
-- Beside it, a register server that no fault touches. Worker processes (half
-- Lua 5.4, half LuaJIT; torture/worker.lua) loop on with_lock over a few keys
-- and log every section. An injector, from a printed seed, meanwhile stops
-- workers past the TTL (SIGSTOP, then SIGCONT) and starts CPU hogs, and hits
-- the lock servers: on one server it kills their clients (CLIENT KILL),
-- pauses it (CLIENT PAUSE WRITE and ALL, also past the TTL), blocks it (DEBUG
-- SLEEP), restarts it (with its data, or killed and emptied as a server
-- without persistence), jumps its clock (torture/clock.lua), cuts or drops
-- its packets; behind Sentinel see torture/sentinel.lua, in a cluster
-- torture/cluster.lua, with Redlock torture/redlock.lua. Then a
-- checker reads the logs and the register (torture/check.lua) and prints one
-- summary line per phase. Exit status 0 when every phase holds.
--
-- Environment: TORTURE_SHORT=1 (each phase 30 s), TORTURE_SECONDS (each
-- phase), TORTURE_WORKERS, TORTURE_NGX_WORKERS (2 of them run their sections
-- in a private nginx: torture/ngx_driver.lua, torture/ngx_app.lua),
-- TORTURE_KEYS, TORTURE_TTL, TORTURE_SEED (replay a run), TORTURE_TLS=1
-- (single: every lock connection over verified TLS; the lock server serves
-- TLS only, the faults reach it over its unix socket), TORTURE_BREAK=1 (a
-- control run without locks, which must fail).
-- usage: sh torture/run.sh (make torture), which sets the module paths and
-- cleans up; the logs of a failing run are printed in part (TORTURE_VERBOSE=1:
-- the faults and details of any run).
local helpers = require("spec.helpers")
local core = require("redislock.core")
local check = require("torture.check")
local ngx_app = require("torture.ngx_app")
local proc = require("torture.proc")
local redislock = require("redislock")

local short = os.getenv("TORTURE_SHORT") == "1"
local seconds = tonumber(os.getenv("TORTURE_SECONDS") or (short and "30" or "180"))
local nworkers = tonumber(os.getenv("TORTURE_WORKERS") or (short and "8" or "16"))
local nkeys = tonumber(os.getenv("TORTURE_KEYS") or "8")
-- Of the workers, this many are OpenResty ones (sections run in nginx).
local nngx = tonumber(os.getenv("TORTURE_NGX_WORKERS") or "2")
local ttl = tonumber(os.getenv("TORTURE_TTL") or "1")
local seed = tonumber(os.getenv("TORTURE_SEED") or "") or (os.time() % 1000000)
local TOPOLOGIES = { "single", "sentinel", "cluster", "redlock" }
local asked = os.getenv("TORTURE_TOPOLOGY") or "single"
local phases = {}
for name in asked:gmatch("[^,%s]+") do
  if name == "all" then
    for _, t in ipairs(TOPOLOGIES) do phases[#phases + 1] = t end
  else
    local known = false
    for _, t in ipairs(TOPOLOGIES) do known = known or t == name end
    if not known then
      io.stderr:write("torture: TORTURE_TOPOLOGY: no topology " .. name .. " (" .. table.concat(TOPOLOGIES, ", ")
                      .. " or all)\n")
      os.exit(2)
    end
    phases[#phases + 1] = name
  end
end
print(string.format("torture: seed %d (replay with TORTURE_SEED=%d), %s, %d workers, %d keys, %g s each, ttl %g s",
                    seed, seed, table.concat(phases, " then "), nworkers, nkeys, seconds, ttl))

local root = helpers.root()
local q = helpers.sh_quote
local tls = os.getenv("TORTURE_TLS") == "1"
local reg_srv = helpers.start_redis()
-- Its error log (a request overdue says there where it stood:
-- torture/ngx_app.lua) and access log are kept with a failing phase's logs.
local nginx = nngx > 0 and helpers.start_nginx({
  workers = 2,
  http = (tls and "lua_ssl_trusted_certificate " .. helpers.tls_certs() .. "/ca.crt; " or "")
    .. "log_format torture '$msec $pid $status $request_time $request_uri'; "
    .. "server { listen 127.0.0.1:{{port}}; access_log {{prefix}}/logs/access.log torture; location = /section { "
    .. "content_by_lua_block { require('torture.ngx_app').section() } "
    .. "log_by_lua_block { require('torture.ngx_app').done() } } }",
})
local ngx_logs = nginx and { "error", "access" } or {}
-- Under $REDISLOCK_TEST_TMP (torture/run.sh removes it whatever happens).
local tmp_root = os.getenv("REDISLOCK_TEST_TMP")

local function sleep(s)
  core.sleep(s)
end

-- The lock side of a phase: { where (the workers' lock argument), faults (a
-- list of functions that return a line for the log), exists(key) (on the
-- master now; with Redlock, on any server), settle() (after the faults: true
-- once the topology serves again), stop([folder]) (keeping the servers' logs
-- there), failover (true: a failover may give a lock twice, silently; the
-- checker counts it), windows (single and Redlock: the clock jumps, { from,
-- to } on the monotonic clock, during which silent overlaps are counted
-- apart) }.
local topology = {}

function topology.single()
  local own = helpers.netns
  if not own then print("torture: single: no network namespace (run as root): no cuts or lossy links in this phase") end
  local host = own and "127.0.0.41" or "127.0.0.1"
  local srv = helpers.start_redis({ "--appendonly", "yes", "--appendfsync", "always" },
                                  { tls = tls and "optional" or nil, host = host })
  local function cli(...) return srv:cli(...) end
  -- The rules in place: { share (nil: every packet) = true }.
  local rules = {}
  local function drop(how, share)
    helpers.drop_between(how, "127.0.0.1", host, share)
    rules[share or "all"] = how == "-A" or nil
  end
  local function heal()
    for share in pairs(rules) do drop("-D", share ~= "all" and share or nil) end
  end
  local windows = {}
  local probe -- a client of the injector's own, made for the first lossy link
  local lock = {
    where = host .. ":" .. srv.port, windows = windows,
    stop = function()
      heal()
      if probe then probe:close() end
      srv:stop()
    end,
    exists = function(key) return cli("EXISTS", key) ~= "0" end,
    settle = function()
      heal()
      return helpers.eventually(10, function() return cli("PING") == "PONG" end)
    end,
    faults = {
      function()
        return "CLIENT KILL TYPE normal: " .. cli("CLIENT", "KILL", "TYPE", "normal")
      end,
      function()
        local ms = math.floor(ttl * 1000 * (0.3 + 1.2 * math.random()))
        local what = math.random(2) == 1 and "WRITE" or "ALL"
        cli("CLIENT", "PAUSE", tostring(ms), what)
        sleep(ms / 1000)
        return string.format("CLIENT PAUSE %d %s", ms, what)
      end,
      function()
        local s = 0.1 + 0.5 * math.random()
        cli("DEBUG", "SLEEP", string.format("%.3f", s))
        return string.format("DEBUG SLEEP %.3f", s)
      end,
      function()
        local started = core.now()
        srv:restart()
        helpers.eventually(10, function() return cli("PING") == "PONG" end)
        return string.format("restart of the lock server (appendfsync always), %.2f s", core.now() - started)
      end,
      function()
        -- Without persistence: its locks are gone (the documented loss), but
        -- not the order of fences, which follow its clock: they are checked
        -- across the restart as across any other fault.
        local started = core.now()
        srv:restart(true)
        helpers.eventually(10, function() return cli("PING") == "PONG" end)
        return string.format("restart of the lock server without its data (kill -9, files removed), %.2f s",
                             core.now() - started)
      end,
      function()
        return require("torture.clock").jump(srv, ttl, windows)
      end,
    },
  }
  if own then
    local faults = lock.faults
    faults[#faults + 1] = function()
      local s = 0.3 + 2.2 * math.random()
      drop("-A")
      sleep(s)
      drop("-D")
      return string.format("the clients cut off from the lock server for %.2f s", s)
    end
    faults[#faults + 1] = function()
      local share, s = 0.1 + 0.4 * math.random(), 1 + 3 * math.random()
      share = tonumber(string.format("%.3f", share))
      -- What the loss does to a call: PINGs over a link of their own, timed.
      -- (A PING may outlast the planned time: the line says how long it was.)
      probe = probe or redislock.new({ host = host, port = srv.port, timeout = 2, connect_timeout = 2,
                                       tls = tls and { ca = helpers.tls_certs() .. "/ca.crt",
                                                       server_name = "localhost" } or nil })
      local took, began = {}, core.now()
      local deadline = began + s
      drop("-A", share)
      while core.now() < deadline do
        local t0 = core.now()
        probe:command("PING")
        took[#took + 1] = (core.now() - t0) * 1000
        sleep(0.05)
      end
      drop("-D", share)
      table.sort(took)
      return string.format("the link between clients and lock server lossy (%d%% of packets dropped) for %.2f s: "
                           .. "%d PINGs took %.0f ms at the median, %.0f ms at most", math.floor(share * 100 + 0.5),
                           core.now() - began, #took, took[math.ceil(#took / 2)], took[#took])
    end
  end
  return lock
end

-- A topology of torture/<name>.lua's group (sentinel, cluster, redlock),
-- started with (own, ...): own, every node on a loopback address of its own,
-- needs the run's network namespace; without it they share 127.0.0.1 and
-- the phase has no partitions. Returns the group, and the topology's fields
-- but its faults.
local function of_group(name, ...)
  local own = helpers.netns
  if not own then print("torture: " .. name .. ": no network namespace (run as root): no partitions in this phase") end
  local g = require("torture." .. name).start(own, ...)
  return g, {
    where = g.where,
    exists = function(key) return g:exists(key) end,
    settle = function() return g:settle() end,
    stop = function(keep) g:stop(keep) end,
  }
end

function topology.sentinel()
  local g, t = of_group("sentinel")
  t.faults, t.failover = g:faults(), true
  return t
end

function topology.cluster()
  local g, t = of_group("cluster", nkeys)
  t.faults, t.failover = g:faults(), true
  return t
end

function topology.redlock()
  local g, t = of_group("redlock")
  t.faults, t.windows = g:faults(ttl), g.windows
  return t
end

-- Runs one phase; returns the checker's result.
local function phase(name, n)
  reg_srv:cli("FLUSHALL")
  -- Where this phase's part of nginx's logs begins.
  local ngx_from = {}
  for _, log in ipairs(ngx_logs) do ngx_from[log] = proc.size(nginx.prefix .. "/logs/" .. log .. ".log") end
  local lock = topology[name]()
  local template = tmp_root and q(tmp_root .. "/" .. name .. ".XXXXXX") or ""
  local dir = (helpers.run("mktemp -d " .. template):gsub("%s+$", ""))
  local tls_env = tls and name == "single" and "TORTURE_TLS_CA=" .. q(helpers.tls_certs() .. "/ca.crt") .. " " or ""

  -- Workers, each in the background: its PID in <dir>/w<i>.pid, its exit
  -- status in <dir>/w<i>.status once it ends, its log in <dir>/w<i>.log.
  local workers = {}
  for i = 1, nworkers do
    local lua, build = "lua5.4", "lua5.4"
    if i % 2 == 0 then lua, build = "luajit", "luajit" end
    local w = { id = i, lua = lua, pidfile = dir .. "/w" .. i .. ".pid", status = dir .. "/w" .. i .. ".status",
                log = dir .. "/w" .. i .. ".log", out = dir .. "/w" .. i .. ".out" }
    local script, before = "worker.lua", ""
    if i <= nngx then
      -- An OpenResty slot: a Lua 5.4 driver sends the sections to nginx.
      lua, build, script, before, w.lua = "lua5.4", "lua5.4", "ngx_driver.lua", nginx.port .. " ", "openresty"
    end
    local cmd = string.format("%sLUA_PATH=%s LUA_CPATH=%s sh -c 'echo $$ > %s; exec %s %s %s%s %d %d %d %g %g %d %s'",
      tls_env, q(root .. "/lua/?.lua;" .. root .. "/?.lua;;"), q(root .. "/build/" .. build .. "/?.so;;"),
      q(w.pidfile), lua, q(root .. "/torture/" .. script), before, lock.where, reg_srv.port, i, nkeys, seconds,
      ttl, (seed * 10 + n) * 100 + i, q(w.log))
    os.execute(string.format("( %s; echo $? > %s ) > %s 2>&1 &", cmd, q(w.status), q(w.out)))
    workers[i] = w
  end
  for _, w in ipairs(workers) do
    assert(helpers.eventually(5, function()
      w.pid = tonumber(helpers.read_file(w.pidfile) or "")
      return w.pid
    end), "worker " .. w.id .. " did not start")
  end

  -- A worker inside a section now (its log's last line is an entry), or nil.
  local function a_holder()
    local holders = {}
    for _, w in ipairs(workers) do
      local text = helpers.read_file(w.log) or ""
      if text:match("\nE [^\n]*\n$") or text:match("^E [^\n]*\n$") then holders[#holders + 1] = w end
    end
    return holders[1] and holders[math.random(#holders)]
  end

  -- Stops w past the TTL (SIGSTOP, then SIGCONT); returns a line for the log.
  local function stop(w, what)
    local pause = ttl * (1.5 + math.random())
    os.execute("kill -STOP " .. w.pid .. " 2>/dev/null")
    sleep(pause)
    os.execute("kill -CONT " .. w.pid .. " 2>/dev/null")
    return string.format("SIGSTOP %s %d for %.2f s", what, w.id, pause)
  end

  -- The faults of every phase (on the workers and the machine), then the
  -- topology's own, each a function that returns a line for the log.
  local faults = {
    function()
      local w = a_holder()
      if w then return stop(w, "holder, worker") end
      return stop(workers[math.random(#workers)], "worker")
    end,
    function()
      return stop(workers[math.random(#workers)], "worker")
    end,
    function()
      -- An nginx worker: its requests, sections and renewal timer all stop.
      local pids = nginx and nginx:workers() or {}
      if #pids == 0 then return stop(workers[math.random(#workers)], "worker") end
      local pid = pids[math.random(#pids)]
      return stop({ pid = pid, id = pid }, "nginx worker, pid")
    end,
    function()
      local hogs = {}
      for i = 1, 2 do
        local p = assert(io.popen("sh -c 'echo $$; exec yes' 2>/dev/null"))
        hogs[i] = { pid = p:read("*l"), pipe = p }
      end
      sleep(1 + math.random())
      for _, h in ipairs(hogs) do
        os.execute("kill " .. h.pid)
        h.pipe:close()
      end
      return "two CPU hogs"
    end,
  }
  local common = #faults
  for _, f in ipairs(lock.faults) do faults[#faults + 1] = f end

  -- The faults injected: { from, to (core.now()), line, kind (the line
  -- without its numbers and details) }.
  local fault_log = {}
  local deadline = core.now() + seconds
  sleep(0.5)
  while core.now() < deadline - 1 do
    -- Two faults in three are the topology's own.
    local k = math.random() < 2 / 3 and common + math.random(#lock.faults) or math.random(common)
    local from = core.now()
    local line = faults[k]()
    fault_log[#fault_log + 1] = { from = from, to = core.now(), line = line,
                                  kind = (line:gsub("([%s:(k])%d[%d.]*", "%1N"):gsub(": .*$", "")) }
    -- A failover takes seconds: the topology's faults leave it time to serve.
    sleep(k > common and lock.failover and 1 + 2 * math.random() or 0.2 + math.random())
  end

  -- Every worker ends by its deadline (plus a section and a wait); one that
  -- has not by then hangs: reported, then killed.
  -- An OpenResty slot's request that never came back is named, and nginx
  -- is given the time to write where it stood (torture/ngx_app.lua's
  -- overdue) before its logs are kept.
  local hung = {}
  local grace = core.now() + 3 * ttl + 5
  local overdue_at = 0
  for _, w in ipairs(workers) do
    while not helpers.read_file(w.status) and core.now() < grace do sleep(0.1) end
    if not helpers.read_file(w.status) then
      hung[#hung + 1] = w.id
      os.execute("kill -CONT " .. w.pid .. " 2>/dev/null; kill -9 " .. w.pid .. " 2>/dev/null")
      local sent, path = (helpers.read_file(w.log .. ".req") or ""):match("^(%S+) (%S+)")
      if sent then
        print(string.format("torture %s: worker %d (openresty) hung in GET %s, sent %.1f s before", name, w.id, path,
                            core.now() - tonumber(sent)))
        local wait = tonumber(path:match("[?&]wait=([%d.]+)")) or 0
        overdue_at = math.max(overdue_at, tonumber(sent) + ngx_app.overdue(wait, ttl) + 2 * ngx_app.LOOK)
      end
    end
  end
  if overdue_at > core.now() then sleep(overdue_at - core.now()) end

  -- Everything expires by itself: after a TTL, a wake-up signal's second
  -- and a fair waiter's stay (3 s) and slack (1 s), no lock, wake-up list,
  -- queue or waiters mark may be left.
  local settled = lock.settle()
  local left
  local function keys_left()
    left = {}
    for k = 1, nkeys do
      for _, suffix in ipairs({ "", ":signal", ":queue", ":hand", ":waiters" }) do
        local key = "lock:{k" .. k .. "}" .. suffix
        if lock.exists(key) then left[#left + 1] = key end
      end
    end
    return #left == 0
  end
  if settled then
    helpers.eventually(ttl + 5.5, keys_left)
  else
    left = { "(the topology never settled: no master to ask)" }
  end

  local result = check.run({
    topology = name, workers = workers, hung = hung, nkeys = nkeys, seconds = seconds, faults = #fault_log,
    register = function(...) return reg_srv:cli(...) end, keys_left = left, seed = seed, failover = lock.failover,
    windows = lock.windows, fault_log = fault_log, ttl = ttl,
  })
  if os.getenv("TORTURE_VERBOSE") == "1" or not result.ok then
    for _, f in ipairs(fault_log) do print(string.format("  fault: %.3f %s", f.from, f.line)) end
    for _, line in ipairs(result.details) do print("  " .. line) end
  end
  print(result.summary)
  -- The faults by kind (their numbers left out), most frequent first.
  local kinds, order = {}, {}
  for _, f in ipairs(fault_log) do
    if not kinds[f.kind] then order[#order + 1] = f.kind end
    kinds[f.kind] = (kinds[f.kind] or 0) + 1
  end
  table.sort(order, function(x, y) return kinds[x] > kinds[y] or (kinds[x] == kinds[y] and x < y) end)
  for i, kind in ipairs(order) do order[i] = kinds[kind] .. " x " .. kind end
  print("torture " .. name .. ": faults: " .. table.concat(order, "; "))
  for _, line in ipairs(result.by_fault) do print("torture " .. name .. ": during " .. line) end
  lock.stop(not result.ok and dir or nil)
  if not result.ok then
    for _, log in ipairs(ngx_logs) do
      proc.keep_log(nginx.prefix .. "/logs/" .. log .. ".log", ngx_from[log], dir .. "/nginx-" .. log .. ".log")
    end
  end
  if not tmp_root then
    if result.ok then os.execute("rm -rf " .. q(dir)) else print("torture: logs kept in " .. dir) end
  end
  return result
end

local ok = true
for n, name in ipairs(phases) do
  math.randomseed(seed * 10 + n)
  local result = phase(name, n)
  ok = ok and result.ok
end
reg_srv:stop()
if nginx then nginx:stop() end
os.exit(ok and 0 or 1)
