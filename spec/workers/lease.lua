-- SPDX-License-Identifier: MIT
-- Worker for the lease specs: takes a lock with with_lock (renewed by the
-- watchdog by default), announces its PID and fence (RPUSH holders), then
-- computes in pure Lua for `seconds` (no Redis calls) and reports how it went:
--   "check: true nil" or "check: nil lost: ..."   (lock:check() after the work)
--   "done <fence>" when with_lock returned, "raised <error>" when it raised.
-- usage: lease.lua <port | tls:port:folder> <key> <ttl> <seconds>
local redislock = require("redislock")
local core = require("redislock.core")

local connect = require("spec.workers.connect")

local key, ttl, seconds = arg[2], tonumber(arg[3]), tonumber(arg[4])
local client = redislock.new(connect(arg[1]))
local pid = assert(io.open("/proc/self/stat")):read("*l"):match("^%d+")

local ok, res = pcall(client.with_lock, client, key, ttl, function(lock)
  assert(client:command("RPUSH", "holders", pid .. " " .. lock.fence))
  local stop, n = core.now() + seconds, 0
  while core.now() < stop do n = n + 1 end -- CPU only; core.now() reads the clock
  local held, why = lock:check()
  print("check: " .. tostring(held) .. " " .. tostring(why))
  return lock.fence
end)
if ok then
  print("done " .. tostring(res))
else
  print("raised " .. tostring(res))
end
