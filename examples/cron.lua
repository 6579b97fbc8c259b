-- SPDX-License-Identifier: MIT
-- The nightly job runs once: cron starts the same job on several machines at
-- the same minute; each tries the lock once, one runs the job, the others skip.
-- Here the machines are processes started together (5, or the number given after
-- the file name); the last line says how many ran the job, and the exit status
-- is 0 only when exactly one did.
--
-- Run by hand (needs a redis-server; REDIS_URL, else 127.0.0.1:6379):
--  REDIS_URL=redis://127.0.0.1:6379 LUA_PATH="lua/?.lua;;" LUA_CPATH="build/lua5.4/?.so;;" lua5.4 examples/cron.lua
-- It uses the lock "nightly-reconciliation" and the key demo:nightly-reconciliation:done:<date>.
--
-- The pattern:
-- * acquire with wait = 0: a busy lock means "another machine runs it", so skip
--   at once instead of queueing behind it;
-- * a ttl longer than the job ever takes (extend the lock if it might not be),
--   so the lock cannot expire while the job still runs;
-- * release at the end, in every case: if the job failed, a rerun can take over
--   at once instead of waiting out the ttl;
-- * a "done" marker, written under the lock when the job succeeded: releasing
--   opens the lock again, and a machine whose cron starts late would otherwise
--   run the job a second time. Under the lock it checks the marker and skips.
--   (Holding the lock until it expires would also stop stragglers, but only for
--   the ttl, and after a failed run it would block a rerun until it expired.)

local redislock = require "redislock"
local core = require "redislock.core"

local JOB = "nightly-reconciliation"
local TTL = 5         -- seconds; production: comfortably longer than the job's worst run
local JOB_TIME = 0.5  -- seconds the pretend job takes
local DEFAULT_WORKERS = 5

-- Runs a plain Redis command on the client's connection and returns the reply
-- (a nil reply is false); raises on failure.
local function redis(client, ...)
  local reply, err = client:command(...)
  if reply == nil then error(err, 2) end
  return reply
end

-- Tonight's marker. The UTC date, so that machines in other time zones agree.
local function done_key()
  return "demo:" .. JOB .. ":done:" .. os.date("!%Y-%m-%d")
end

local function say(id, fmt, ...)
  print(string.format("worker %d: " .. fmt, id, ...))
end

-- The job itself, run while holding the lock.
local function reconcile(client, id, lock)
  if redis(client, "EXISTS", done_key()) == 1 then
    say(id, "skipped, tonight's run is already done")
    return
  end
  say(id, "running the nightly reconciliation (fence %d)", lock.fence)
  core.sleep(JOB_TIME)  -- the real work goes here
  -- Kept two days, so it cleans itself up; only a finished job writes it.
  redis(client, "SET", done_key(), "worker " .. id, "EX", 2 * 24 * 3600)
end

-- Worker mode: one machine's cron run.
local function worker(id, start_at)
  local client = redislock.default_client()  -- REDIS_URL, else 127.0.0.1:6379
  core.sleep(math.max(0, start_at - core.now()))

  local lock, err = client:acquire(JOB, TTL, { wait = 0 })
  if not lock then
    if err:match("^busy") then
      say(id, "skipped, another machine runs it (%s)", err)
      return
    end
    error(err, 0)  -- connection or redis: nobody knows whether it ran, so fail loudly
  end

  local ok, job_err = pcall(reconcile, client, id, lock)
  local released, release_err = lock:release()
  if not ok then error(job_err, 0) end
  -- "lost": the job outlived the ttl, and another machine may have run it too.
  if not released then error(release_err, 0) end
end

local function sh_quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- The interpreter running this file (lua5.4 or luajit), so that the workers run
-- under the same one: the lowest negative index of arg, as in `lua5.4 file.lua`.
local function interpreter()
  local i = -1
  while arg and arg[i - 1] ~= nil do i = i - 1 end
  return (arg and arg[i]) or os.getenv("REDISLOCK_LUA") or (jit and "luajit" or "lua5.4")
end

local function main()
  local workers = tonumber(arg[1] or DEFAULT_WORKERS)
  if not workers or workers < 1 or workers ~= math.floor(workers) then
    io.stderr:write("usage: cron.lua [number of worker processes]\n")
    return 2
  end
  local client = redislock.default_client()
  -- Every run of this example plays the same night again: forget its marker.
  redis(client, "DEL", done_key())
  client:close()

  -- A common start time on the monotonic clock (one clock for all processes),
  -- as cron starts the job on every machine at the same minute.
  local start_at = string.format("%.6f", core.now() + 0.3)
  local pipes = {}
  for id = 1, workers do
    local cmd = table.concat({ sh_quote(interpreter()), sh_quote(arg[0]), "worker", id, start_at }, " ")
    pipes[id] = assert(io.popen(cmd .. " 2>&1", "r"))
  end

  local ran, failed = 0, 0
  for id, p in ipairs(pipes) do
    local out = p:read("*a")
    p:close()  -- LuaJIT does not report the exit status here: the output is the proof
    io.write(out)
    if out:match("^worker %d+: running") then
      ran = ran + 1
    elseif not out:match("^worker %d+: skipped") then
      io.write(string.format("worker %d: failed (see above)\n", id))
      failed = failed + 1
    end
  end
  print(string.format("%d of %d workers ran the nightly reconciliation%s", ran, workers,
                      ran == 1 and failed == 0 and ": it ran once" or ""))
  return (ran == 1 and failed == 0) and 0 or 1
end

if arg[1] == "worker" then
  worker(assert(tonumber(arg[2]), "worker: id expected"), assert(tonumber(arg[3]), "worker: start time expected"))
else
  local ok, status = pcall(main)
  if not ok then
    io.stderr:write("cron: ", tostring(status), "\n")
    status = 1
  end
  os.exit(status)
end
