-- SPDX-License-Identifier: MIT
-- Runs inside the private nginx of bench/stampede.lua (a benchmark, not a
-- test): GET /report of examples/openresty (redislock_examples/report.lua)
-- with a lock local to the machine in place of redislock's, the floor a
-- Redis lock can be held to: lua-resty-lock's algorithm (Debian does not
-- package lua-resty-lock), an ngx.shared.DICT:add that expires, tried again
-- after a sleep that doubles from 1 ms up to 0.5 s, and a delete.
-- The cache and the rebuild count stay in Redis, through the example's own
-- client, as in the example.
-- luacheck: read globals ngx
local common = require("redislock_examples.common")

local M = {}

local CACHE_KEY, REBUILDS_KEY = "example:report", "example:report:rebuilds"
local REBUILD, LOCK_TTL, LOCK_WAIT = 0.2, 5, 3 -- as report.lua's
local STEP, RATIO, MAX_STEP = 0.001, 2, 0.5  -- lua-resty-lock's defaults

local function lock(dict, key)
  local step, waited = STEP, 0
  while true do
    if dict:add(key, true, LOCK_TTL) then return true end
    if waited >= LOCK_WAIT then return false end
    local pause = math.min(step, LOCK_WAIT - waited)
    ngx.sleep(pause)
    waited = waited + pause
    step = math.min(step * RATIO, MAX_STEP)
  end
end

local function report()
  local redis = common.redis
  local cached = redis("GET", CACHE_KEY)
  if cached then return 200, cached, { ["X-Cache"] = "hit" } end
  local dict = ngx.shared.stampede_locks
  if not lock(dict, "report") then return 503, { error = "busy" }, {} end
  local ok, body, how = pcall(function()
    local again = redis("GET", CACHE_KEY)
    if again then return again, "waited" end
    ngx.sleep(REBUILD)
    local n = redis("INCR", REBUILDS_KEY)
    local built = common.json{ built_at = ngx.now(), rebuild = n, built_by = ngx.worker.pid() }
    redis("SET", CACHE_KEY, built, "EX", 30)
    return built, "rebuilt"
  end)
  dict:delete("report")
  if not ok then error(body, 0) end
  return 200, body, { ["X-Cache"] = how }
end

function M.handle()
  return common.run(report)
end

return M
