-- SPDX-License-Identifier: MIT
-- Measurement (not a test): how short a TTL the watchdog keeps renewed. For
-- each TTL, BENCH_FLOOR_HOLDS (10) with_locks each hold their lock for one
-- second (sleeping in 1 ms steps), and the holds that ended lost are counted.
-- BENCH_FLOOR_BUSY (0) processes spin on the CPU meanwhile, to show a loaded
-- machine. Figures for docs/lock.md's renewal section:
--   sh tools/with-redis.sh lua5.4 bench/renewal_floor.lua
--   BENCH_FLOOR_BUSY=2 sh tools/with-redis.sh lua5.4 bench/renewal_floor.lua
local redislock = require("redislock")
local core = require("redislock.core")

local holds = tonumber(os.getenv("BENCH_FLOOR_HOLDS") or "10")
local busy = tonumber(os.getenv("BENCH_FLOOR_BUSY") or "0")
local client = redislock.new{ url = assert(os.getenv("REDIS_URL"), "run me under tools/with-redis.sh") }

-- Spinning processes, stopped by PID at the end.
local pids = {}
for i = 1, busy do
  local p = assert(io.popen("sh -c 'echo $$; exec yes' 2>/dev/null"))
  pids[i] = { pid = p:read("*l"), pipe = p }
end

for _, ttl in ipairs({ 0.003, 0.005, 0.01, 0.02, 0.05, 0.1 }) do
  local lost = 0
  for i = 1, holds do
    local ok = pcall(client.with_lock, client, "floor:" .. i, ttl, function()
      local stop = core.now() + 1
      while core.now() < stop do core.sleep(0.001) end
    end)
    if not ok then lost = lost + 1 end
  end
  print(string.format("bench name=renewal_floor ttl_ms=%d busy=%d lost=%d of=%d",
                      math.floor(ttl * 1000 + 0.5), busy, lost, holds))
end

for _, p in ipairs(pids) do
  os.execute("kill " .. p.pid)
  p.pipe:close()
end
client:close()
