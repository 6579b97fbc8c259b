-- SPDX-License-Identifier: MIT
-- Worker for the lock delay spec: takes a lock (kind "lock", with_lock) or
-- the one permit of a semaphore (kind "permit", with_permit) with a lock
-- delay, renewed by the watchdog, announces its PID and fence (RPUSH
-- holders), then looks at lock:check() every 10 ms for `seconds` (with
-- "cpu": computes for `seconds`, with no call into redislock, then looks
-- once, so that only the watchdog can find a loss) and says when it first
-- failed:
--   "lost <core.now()> <why>"  (check's message, from the watchdog or the clock)
--   "done" when the scoped call returned, "raised <error>" when it raised.
-- usage: delayed.lua <port> <lock | permit> <key> <ttl> <delay> <seconds> [cpu]
local redislock = require("redislock")
local core = require("redislock.core")

local connect = require("spec.workers.connect")

local kind, key, ttl, delay, seconds = arg[2], arg[3], tonumber(arg[4]), tonumber(arg[5]), tonumber(arg[6])
local cpu = arg[7] == "cpu"
local client = redislock.new(connect(arg[1]))
local pid = assert(io.open("/proc/self/stat")):read("*l"):match("^%d+")

local function work(lock)
  assert(client:command("RPUSH", "holders", pid .. " " .. lock.fence))
  local stop = core.now() + seconds
  if cpu then
    while core.now() < stop do end -- CPU only; core.now() reads the clock
  end
  repeat
    local held, why = lock:check()
    if not held then
      print(string.format("lost %.3f %s", core.now(), why))
      break
    end
    core.sleep(0.01)
  until cpu or core.now() >= stop
end

local ok, err
if kind == "permit" then
  local sem = client:semaphore(key, 1)
  ok, err = pcall(sem.with_permit, sem, ttl, work, { lock_delay = delay })
else
  ok, err = pcall(client.with_lock, client, key, ttl, work, { lock_delay = delay })
end
print(ok and "done" or "raised " .. tostring(err))
