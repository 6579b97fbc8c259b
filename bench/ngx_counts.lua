-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): what one uncontended acquire+release costs an
-- nginx worker, counted, beside the minimal lua-resty-redis lock of
-- bench/ngx_bench.lua (SET NX PX, then a compare-and-delete EVAL, a pooled
-- connection per cycle) in the same worker: its system calls (strace -c
-- attached to the worker) and its instructions (callgrind, nginx run with
-- master_process off under valgrind), each over a request of 1,000 and one
-- of 3,000 cycles, the difference over 2,000 (the request's own cost and
-- LuaJIT's compiling leave with it). Counts do not move with a busy machine
-- as rates do. Then the server's commands and CPU time per cycle of each
-- path (INFO). Prints one `bench name=...` line per figure.
--   sh tools/with-redis.sh luajit bench/ngx_counts.lua   (bench/run.sh runs it)
local http = require("socket.http")
local socket = require("socket")
local B = require("benchlib")
local ngxlib = require("ngxlib")

local PATHS = { { "redislock", "redislock over cosockets" },
                { "resty", "lua-resty-redis 0.27, pooled connect per cycle" } }

local function conf(master)
  return function(prefix, port)
    return ngxlib.conf(prefix, {
      main = master and "" or "master_process off;",
      daemon = master,
      http = table.concat({
        "  server {",
        "    listen 127.0.0.1:" .. port .. ";",
        "    location / { content_by_lua_block { require('ngx_bench').handle(" .. B.port .. ") } }",
        "  }",
      }, "\n"),
    })
  end
end

local function get(port, path, n)
  local body, code = http.request(string.format("http://127.0.0.1:%d/%s?n=%d", port, path, n))
  assert(code == 200 and body:match("cycles_per_s="), path .. " in nginx failed: " .. tostring(body))
end

-- The worker of the nginx whose master is pid (one worker).
local function worker_of(pid)
  local out = B.run("cat /proc/" .. pid .. "/task/*/children 2>/dev/null")
  out = tostring(out)
  return assert(tonumber(out:match("%d+")), "no worker under nginx " .. pid)
end

-- Runs fn while path's result is traced by a command (strace, ...) that
-- writes to file; returns file's text.
local function traced(cmd, file, fn)
  local pid = tonumber((B.run(cmd .. " >/dev/null 2>&1 & echo $!")))
  socket.sleep(0.5) -- attached
  fn()
  os.execute("kill -INT " .. pid .. " 2>/dev/null")
  local deadline = B.now() + 10
  local text
  repeat
    socket.sleep(0.1)
    text = ngxlib.read_file(file)
  until (text and text:find("total")) or B.now() > deadline
  return assert(text, cmd .. " wrote nothing")
end

-- strace -c's table: calls by name ("total" too).
local function strace_calls(text)
  local calls = {}
  for line in text:gmatch("[^\n]+") do
    local fields = {}
    for w in line:gmatch("%S+") do fields[#fields + 1] = w end
    -- % time, seconds, usecs/call, calls, [errors,] name
    if #fields >= 5 and tonumber(fields[1]) then calls[fields[#fields]] = tonumber(fields[4]) end
  end
  assert(calls.total, "no total in strace's table:\n" .. text)
  return calls
end

-- System calls per cycle of each path, strace attached to the worker.
local function syscalls()
  local _, has = B.run("command -v strace")
  if not has then return B.say("bench: no strace: the worker's system calls skipped") end
  local port, pid, prefix = ngxlib.start(conf(true))
  local ok, err = pcall(function()
    local worker = worker_of(pid)
    local per = {}
    for _, p in ipairs(PATHS) do
      get(port, p[1], 1000) -- warm up: the pool, the scripts, the traces
      local counts = {}
      for _, n in ipairs({ 1000, 3000 }) do
        local file = prefix .. "/strace." .. p[1] .. "." .. n
        counts[n] = strace_calls(traced("strace -c -p " .. worker .. " -o " .. B.sh_quote(file), file,
                                        function() get(port, p[1], n) end))
      end
      -- To a tenth: a call strace sees merged with another's now and then
      -- (epoll_wait finding two events) is not a call saved.
      per[p[1]] = math.floor((counts[3000].total - counts[1000].total) / 200 + 0.5) / 10
      local names = {}
      for name, c in pairs(counts[3000]) do
        local d = (c - (counts[1000][name] or 0)) / 2000
        if name ~= "total" and d >= 0.005 then names[#names + 1] = string.format("%s %.3g", name, d) end
      end
      table.sort(names)
      per[p[1] .. "_note"] = table.concat(names, ", ")
    end
    for i, p in ipairs(PATHS) do
      B.emit({ name = "ngx.syscalls/" .. p[1], value = per[p[1]], unit = "syscalls/cycle",
               baseline = i > 1 and "ngx.syscalls/redislock" or nil, baseline_value = i > 1 and per.redislock or nil,
               ratio = i > 1 and per[p[1]] / per.redislock or nil, target = i > 1 and { ">=", 1.0 } or nil,
               note = "strace -c -p <worker>, 3000 less 1000: " .. per[p[1] .. "_note"],
               label = "worker system calls, " .. p[2] })
    end
  end)
  ngxlib.stop(pid, prefix)
  assert(ok, err)
end

-- Instructions per cycle of each path: nginx alone (master_process off)
-- under callgrind, zeroed before and dumped after each request.
local function instructions()
  local _, has = B.run("command -v valgrind")
  if not has then return B.say("bench: no valgrind: the worker's instructions skipped") end
  local prefix = ngxlib.prefix()
  local port = B.free_port()
  local f = assert(io.open(prefix .. "/conf/nginx.conf", "w"))
  f:write(conf(false)(prefix, port))
  f:close()
  local out = prefix .. "/cg.out"
  local pid = tonumber((B.run("env -u LUA_PATH -u LUA_CPATH valgrind --tool=callgrind --callgrind-out-file="
                             .. B.sh_quote(out) .. " nginx -p " .. B.sh_quote(prefix .. "/") .. " -c "
                             .. B.sh_quote(prefix .. "/conf/nginx.conf") .. " > "
                             .. B.sh_quote(prefix .. "/logs/valgrind.out") .. " 2>&1 & echo $!")))
  local ok, err = pcall(function()
    local deadline = B.now() + 60
    repeat
      socket.sleep(0.2)
      local c = socket.tcp()
      c:settimeout(0.2)
      local up = c:connect("127.0.0.1", port)
      c:close()
    until up or B.now() > deadline
    local dumps = 0
    local per = {}
    for _, p in ipairs(PATHS) do
      get(port, p[1], 1000) -- warm up
      local counts = {}
      for _, n in ipairs({ 1000, 3000 }) do
        B.run("callgrind_control -z " .. pid)
        get(port, p[1], n)
        B.run("callgrind_control -d " .. pid)
        dumps = dumps + 1
        local text = assert(ngxlib.read_file(out .. "." .. dumps), "callgrind wrote no dump")
        counts[n] = assert(tonumber(text:match("\nsummary: (%d+)") or text:match("\ntotals: (%d+)")))
      end
      per[p[1]] = (counts[3000] - counts[1000]) / 2000
    end
    for i, p in ipairs(PATHS) do
      B.emit({ name = "ngx.instructions/" .. p[1], value = math.floor(per[p[1]]), unit = "instructions/cycle",
               baseline = i > 1 and "ngx.instructions/redislock" or nil,
               baseline_value = i > 1 and math.floor(per.redislock) or nil,
               ratio = i > 1 and per[p[1]] / per.redislock or nil,
               note = "callgrind, nginx master_process off, 3000 less 1000", label = "worker instructions, " .. p[2] })
    end
  end)
  os.execute("kill -QUIT " .. pid .. " 2>/dev/null")
  socket.sleep(1)
  os.execute("kill -KILL " .. pid .. " 2>/dev/null")
  os.execute("rm -rf " .. B.sh_quote(prefix))
  assert(ok, err)
end

-- What each path costs the server per cycle: its commands (INFO
-- commandstats) and its CPU time (INFO cpu, user + system), over requests
-- of 3,000 cycles, the paths in turn three times; the medians.
local function server()
  local core = require("redislock.core")
  local raw = core.new({ port = B.port })
  local function info(section) return assert(raw:command("INFO", section)) end
  local function cpu()
    local s = info("cpu")
    return tonumber(s:match("used_cpu_sys:([%d.]+)")) + tonumber(s:match("used_cpu_user:([%d.]+)"))
  end
  local function calls()
    local t = {}
    for name, c in info("commandstats"):gmatch("cmdstat_([%w|_-]+):calls=(%d+)") do t[name] = tonumber(c) end
    return t
  end
  local N = 3000
  local port, pid, prefix = ngxlib.start(conf(true))
  local ok, err = pcall(function()
    local per, cmds = {}, {}
    for _, p in ipairs(PATHS) do
      get(port, p[1], 1000) -- warm up
      per[p[1]] = {}
    end
    for _ = 1, 3 do
      for _, p in ipairs(PATHS) do
        local c0, k0 = cpu(), calls()
        get(port, p[1], N)
        local c1, k1 = cpu(), calls()
        table.insert(per[p[1]], (c1 - c0) * 1e6 / N)
        local parts = {}
        for name, c in pairs(k1) do
          local d = (c - (k0[name] or 0)) / N
          if name ~= "info" and d >= 0.01 then parts[#parts + 1] = string.format("%s %.3g", name, d) end
        end
        table.sort(parts)
        cmds[p[1]] = table.concat(parts, ", ")
      end
    end
    local med = {}
    for _, p in ipairs(PATHS) do
      table.sort(per[p[1]])
      med[p[1]] = per[p[1]][2]
    end
    for i, p in ipairs(PATHS) do
      B.emit({ name = "ngx.server_cpu/" .. p[1], value = med[p[1]], unit = "us/cycle",
               baseline = i > 1 and "ngx.server_cpu/redislock" or nil, baseline_value = i > 1 and med.redislock or nil,
               ratio = i > 1 and med[p[1]] / med.redislock or nil,
               note = string.format("INFO cpu, median of 3 requests of %d cycles; per cycle: %s", N, cmds[p[1]]),
               label = "server CPU per cycle, " .. p[2] })
    end
  end)
  ngxlib.stop(pid, prefix)
  raw:close()
  assert(ok, err)
end

syscalls()
instructions()
server()
