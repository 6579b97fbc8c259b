-- SPDX-License-Identifier: MIT
-- Oversell: several processes sell the same 100 units of stock kept in Redis.
--
-- A sale reads the stock, takes a moment (the work every real service does
-- between reading and writing), then writes stock - 1. Without a lock two
-- workers read the same number and both sell that unit, so more than 100 units
-- go out. With client:with_lock around the read-modify-write, exactly 100 do.
--
-- Run by hand (needs a redis-server; REDIS_URL, else 127.0.0.1:6379):
--  REDIS_URL=redis://127.0.0.1:6379 LUA_PATH="lua/?.lua;;" LUA_CPATH="build/lua5.4/?.so;;" lua5.4 examples/oversell.lua
-- A number after the file name sets how many worker processes sell (default 8).
-- It overwrites the keys demo:stock and demo:sold. Exit status 0 only when the
-- run with the lock sold exactly 100 units.

local redislock = require "redislock"
local core = require "redislock.core"

local STOCK_KEY, SOLD_KEY = "demo:stock", "demo:sold"
local UNITS = 100
local LOCK_NAME = "stock"
local LOCK_TTL = 5    -- seconds: far longer than one sale, so it never expires mid-sale
local LOCK_WAIT = 10  -- seconds a worker queues for the lock before giving up
-- Seconds between reading and writing the stock. Every worker that reads while
-- another pauses reads the same number, so without a lock nearly every unit is
-- sold once per worker.
local PAUSE = 0.001
local DEFAULT_WORKERS = 8

-- Runs a plain Redis command on the client's connection and returns the reply
-- (a nil reply is false); raises on failure.
local function redis(client, ...)
  local reply, err = client:command(...)
  if reply == nil then error(err, 2) end
  return reply
end

-- One sale: if any stock is left, writes one less and counts the unit sold.
-- Returns false once the stock is gone.
local function sell_one(client)
  local stock = tonumber(redis(client, "GET", STOCK_KEY)) or 0
  if stock <= 0 then return false end
  core.sleep(PAUSE)
  redis(client, "SET", STOCK_KEY, stock - 1)
  redis(client, "INCR", SOLD_KEY)
  return true
end

-- Worker mode: sells until the stock is gone, then prints "sold N".
local function worker(mode, start_at)
  local client = redislock.default_client()  -- REDIS_URL, else 127.0.0.1:6379
  redis(client, "PING")  -- connect before the start line, so that no worker starts late
  core.sleep(math.max(0, start_at - core.now()))
  local sold = 0
  local sell = sell_one
  if mode == "locked" then
    sell = function(c)
      return c:with_lock(LOCK_NAME, LOCK_TTL, function() return sell_one(c) end, { wait = LOCK_WAIT })
    end
  end
  while sell(client) do sold = sold + 1 end
  print("sold " .. sold)
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

-- Starts `workers` processes in the given mode, waits for all of them and
-- returns the number of units sold (from Redis), or nil when a worker failed.
local function run(client, mode, workers)
  redis(client, "SET", STOCK_KEY, UNITS)
  redis(client, "SET", SOLD_KEY, 0)
  -- A common start time on the monotonic clock (one clock for all processes):
  -- the workers race from the same moment, not in the order they were spawned.
  local start_at = string.format("%.6f", core.now() + 0.3)
  local cmd = table.concat({ sh_quote(interpreter()), sh_quote(arg[0]), "worker", mode, start_at }, " ")
  local pipes = {}
  for i = 1, workers do pipes[i] = assert(io.popen(cmd .. " 2>&1", "r")) end
  local ok = true
  for i, p in ipairs(pipes) do
    local out = p:read("*a")
    p:close()  -- LuaJIT does not report the exit status here: the "sold" line is the proof
    if not out:match("^sold %d+\n$") then
      io.stderr:write(string.format("%s worker %d failed:\n%s\n", mode, i, out))
      ok = false
    end
  end
  if not ok then return nil end
  return tonumber(redis(client, "GET", SOLD_KEY))
end

local function main()
  local workers = tonumber(arg[1] or DEFAULT_WORKERS)
  if not workers or workers < 1 or workers ~= math.floor(workers) then
    io.stderr:write("usage: oversell.lua [number of worker processes]\n")
    return 2
  end
  local client = redislock.default_client()

  local sold = run(client, "unlocked", workers)
  if not sold then return 1 end
  local who = workers == 1 and "1 worker" or workers .. " workers"
  local line = string.format("without a lock: %s sold %d units of %d", who, sold, UNITS)
  if sold > UNITS then
    line = line .. string.format(" (oversold by %d)", sold - UNITS)
  else
    line = line .. " (no oversell this time)"
  end
  print(line)

  sold = run(client, "locked", workers)
  if not sold then return 1 end
  print(string.format("with with_lock: %s sold %d units of %d", who, sold, UNITS))

  redis(client, "DEL", STOCK_KEY, SOLD_KEY)
  client:close()
  return sold == UNITS and 0 or 1
end

if arg[1] == "worker" then
  worker(arg[2], assert(tonumber(arg[3]), "worker: start time expected"))
else
  local ok, status = pcall(main)
  if not ok then
    io.stderr:write("oversell: ", tostring(status), "\n")
    status = 1
  end
  os.exit(status)
end
