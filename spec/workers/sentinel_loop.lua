-- SPDX-License-Identifier: MIT
-- Worker for the Sentinel spec: loops with_lock (waiting) on one key through
-- the sentinels until `seconds` pass, each section a few milliseconds long.
-- Prints one line per section that returned ok, "ok <enter> <exit> <port>
-- <fence>" (core.now() times; port: the master it ran on), one per error,
-- "err <message>", and "done" at the end.
-- usage: sentinel_loop.lua <sentinels, comma-separated> <master> <seconds> <start_at (core.now seconds)>
local redislock = require "redislock"
local core = require "redislock.core"

local sentinels = {}
for a in arg[1]:gmatch("[^,]+") do sentinels[#sentinels + 1] = a end
local master, seconds, start_at = arg[2], tonumber(arg[3]), tonumber(arg[4])
local client = redislock.new({ sentinels = sentinels, master = master, timeout = 2 })

local delay = start_at - core.now()
if delay > 0 then core.sleep(delay) end
local stop_at = core.now() + seconds
while core.now() < stop_at do
  local enter, leave, port, fence
  local ok, err = pcall(client.with_lock, client, "failover", 2, function(lock)
    enter = core.now()
    port = client._transport._port
    fence = lock.fence
    core.sleep(0.002)
    leave = core.now()
  end, { wait = 5 })
  if ok then
    print(string.format("ok %.6f %.6f %d %d", enter, leave, port, fence))
  else
    print("err " .. tostring(err):gsub("\n", " "))
    core.sleep(0.01)
  end
end
client:close()
print("done")
