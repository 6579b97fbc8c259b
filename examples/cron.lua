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

local redislock = require("redislock")
local core = require("redislock.core")
-- The worker processes that stand for the machines (examples/workers.lua).
local workers = dofile((arg[0]:match("^(.*/)") or "") .. "workers.lua")
local redis = workers.redis

local JOB = "nightly-reconciliation"
local TTL = 5         -- seconds; production: comfortably longer than the job's worst run
local JOB_TIME = 0.5  -- seconds the pretend job takes
local DEFAULT_WORKERS = 5

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
  id = assert(tonumber(id), "worker: id expected")
  local client = redislock.default_client()  -- REDIS_URL, else 127.0.0.1:6379
  workers.wait_start(start_at)

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

-- Plays one night: n machines start the job at the same moment.
local function main(n)
  local client = redislock.default_client()
  -- Every run of this example plays the same night again: forget its marker.
  redis(client, "DEL", done_key())
  client:close()

  -- A common start, as cron starts the job on every machine at the same minute.
  local start_at = workers.start_line()
  local list = {}
  for id = 1, n do list[id] = { id, start_at } end

  local ran, failed = 0, 0
  for id, out in ipairs(workers.run(list)) do
    io.write(out)
    if out:match("^worker %d+: running") then
      ran = ran + 1
    elseif not out:match("^worker %d+: skipped") then
      io.write(string.format("worker %d: failed (see above)\n", id))
      failed = failed + 1
    end
  end
  print(string.format("%d of %d workers ran the nightly reconciliation%s", ran, n,
                      ran == 1 and failed == 0 and ": it ran once" or ""))
  return (ran == 1 and failed == 0) and 0 or 1
end

workers.main(main, worker, DEFAULT_WORKERS)
