-- SPDX-License-Identifier: MIT
--- Example (c): a cache-stampede guard. GET /report answers from a cache in
-- Redis. When the cache is empty, one request takes the lock "report" and
-- rebuilds it (slowly: REBUILD seconds); the requests that arrive meanwhile
-- wait for the lock and then read what it built, instead of all rebuilding
-- at once. Whoever gets the lock looks at the cache again first: the request
-- before it may have just filled it (double-checked).
--
-- The X-Cache header says how each answer was made: "hit", "waited" (a miss;
-- the lock was held by a rebuild, which filled the cache) or "rebuilt".
-- Rebuilds are counted in example:report:rebuilds, so that a test can see
-- that a stampede made exactly one.

local common = require("redislock_examples.common")

local error, pcall = error, pcall
local client, redis, run, json = common.client, common.redis, common.run, common.json

local _M = {}

local CACHE_KEY, REBUILDS_KEY = "example:report", "example:report:rebuilds"
local CACHE_TTL = 30  -- seconds the report stays cached
local REBUILD = 0.2   -- seconds a rebuild takes (simulated)
local LOCK_TTL = 5    -- seconds: far longer than a rebuild
local LOCK_WAIT = 3   -- seconds a request waits for a rebuild to finish

-- Builds the report, stores it in the cache and returns it (JSON text).
local function rebuild()
  ngx.sleep(REBUILD)  -- the slow part: queries, rendering ...
  local n = redis("INCR", REBUILDS_KEY)
  local report = json{ built_at = ngx.now(), rebuild = n, built_by = ngx.worker.pid() }
  redis("SET", CACHE_KEY, report, "EX", CACHE_TTL)
  return report
end

local function report(guarded)
  local cached = redis("GET", CACHE_KEY)
  if cached then return 200, cached, { ["X-Cache"] = "hit" } end
  if not guarded then return 200, rebuild(), { ["X-Cache"] = "rebuilt" } end
  -- with_lock releases the lock however fn ends, and raises what fn raised.
  local ok, body, how = pcall(client.with_lock, client, "report", LOCK_TTL, function()
    local again = redis("GET", CACHE_KEY)
    if again then return again, "waited" end
    return rebuild(), "rebuilt"
  end, { wait = LOCK_WAIT })
  if not ok then
    if common.code(body) == "busy" then  -- a rebuild is taking longer than LOCK_WAIT
      return 503, { error = "busy", message = body }, { ["Retry-After"] = "1" }
    end
    -- connection or redis: 503 too, with the error text. lost (the rebuild
    -- outlived LOCK_TTL, so another may have run beside it) means LOCK_TTL is
    -- too short: run() logs it and answers 500.
    error(body, 0)
  end
  return 200, body, { ["X-Cache"] = how }
end

--- content_by_lua for GET /report.
function _M.handle()
  return run(function() return report(true) end)
end

--- content_by_lua for GET /unguarded/report: the same without the lock, to
-- compare: every request that finds the cache empty rebuilds it.
function _M.handle_unguarded()
  return run(function() return report(false) end)
end

return _M
