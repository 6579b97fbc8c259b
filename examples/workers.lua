-- SPDX-License-Identifier: MIT
-- What cron.lua, oversell.lua and primitives.lua share to play several
-- machines on one: each machine is a worker process, the example's own file
-- run again (under the interpreter that runs it) with "worker" and its
-- arguments. Not part of the patterns they show: for real, each machine
-- runs the worker's code itself, and none of this is needed. An example
-- loads it from beside its own file:
--   local workers = dofile((arg[0]:match("^(.*/)") or "") .. "workers.lua")
local core = require("redislock.core")

local unpack = table.unpack or unpack -- LuaJIT has the global only

local W = {}

--- Runs a plain Redis command on the client's connection and returns the
-- reply (a nil reply is false); raises on failure.
function W.redis(client, ...)
  local reply, err = client:command(...)
  if reply == nil then error(err, 2) end
  return reply
end

--- A moment 0.3 s from now on the monotonic clock, one clock for all
-- processes, as text for the workers' arguments: started together, they race
-- from that moment on, not in the order they were spawned.
function W.start_line()
  return string.format("%.6f", core.now() + 0.3)
end

--- Sleeps until the moment start_line gave (text or number).
function W.wait_start(at)
  core.sleep(math.max(0, assert(tonumber(at), "worker: start time expected") - core.now()))
end

local function sh_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- The interpreter running the example (lua5.4 or luajit), so that the workers
-- run under the same one: the lowest negative index of arg, as in `lua5.4 file.lua`.
local function interpreter()
  local i = -1
  while arg[i - 1] ~= nil do i = i - 1 end
  return arg[i] or os.getenv("REDISLOCK_LUA") or (jit and "luajit" or "lua5.4")
end

--- Starts a worker for each list of arguments in list, all at once, waits
-- for all of them and returns their outputs (stdout and stderr), in order.
function W.run(list)
  local procs = {}
  for i, args in ipairs(list) do
    local words = { sh_quote(interpreter()), sh_quote(arg[0]), "worker" }
    for _, a in ipairs(args) do words[#words + 1] = sh_quote(a) end
    procs[i] = assert(io.popen(table.concat(words, " ") .. " 2>&1", "r"))
  end
  local outs = {}
  for i, p in ipairs(procs) do
    outs[i] = p:read("*a")
    p:close() -- LuaJIT does not report the exit status here: the output is the proof
  end
  return outs
end

--- Runs the example and exits. As a worker (arg[1] "worker"): worker(the
-- arguments after it). Else main(n), n the number of workers given after
-- the file name (default_n when none; without default_n, main()), and exits
-- with the status main returns (1 when it raised, its error on stderr).
function W.main(main, worker, default_n)
  if arg[1] == "worker" then
    worker(unpack(arg, 2))
    os.exit(0)
  end
  local name = arg[0]:match("([^/]*)$")
  local n = default_n and tonumber(arg[1] or default_n)
  if default_n and not (n and n >= 1 and n == math.floor(n)) then
    io.stderr:write("usage: ", name, " [number of worker processes]\n")
    os.exit(2)
  end
  local ok, status = pcall(main, n)
  if not ok then
    io.stderr:write(name, ": ", tostring(status), "\n")
    status = 1
  end
  os.exit(status)
end

return W
