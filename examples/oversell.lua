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

local redislock = require("redislock")
local core = require("redislock.core")
-- The worker processes that sell side by side (examples/workers.lua).
local workers = dofile((arg[0]:match("^(.*/)") or "") .. "workers.lua")
local redis = workers.redis

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
  workers.wait_start(start_at)
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

-- Starts n workers in the given mode, waits for all of them and returns the
-- number of units sold (from Redis), or nil when a worker failed.
local function run(client, mode, n)
  redis(client, "SET", STOCK_KEY, UNITS)
  redis(client, "SET", SOLD_KEY, 0)
  -- A common start: the workers race from the same moment, not in the order
  -- they were spawned.
  local start_at = workers.start_line()
  local list = {}
  for i = 1, n do list[i] = { mode, start_at } end
  local ok = true
  for i, out in ipairs(workers.run(list)) do
    if not out:match("^sold %d+\n$") then
      io.stderr:write(string.format("%s worker %d failed:\n%s\n", mode, i, out))
      ok = false
    end
  end
  if not ok then return nil end
  return tonumber(redis(client, "GET", SOLD_KEY))
end

-- Sells the stock with n workers, without the lock and then with it.
local function main(n)
  local client = redislock.default_client()

  local sold = run(client, "unlocked", n)
  if not sold then return 1 end
  local who = n == 1 and "1 worker" or n .. " workers"
  local line = string.format("without a lock: %s sold %d units of %d", who, sold, UNITS)
  if sold > UNITS then
    line = line .. string.format(" (oversold by %d)", sold - UNITS)
  else
    line = line .. " (no oversell this time)"
  end
  print(line)

  sold = run(client, "locked", n)
  if not sold then return 1 end
  print(string.format("with with_lock: %s sold %d units of %d", who, sold, UNITS))

  redis(client, "DEL", STOCK_KEY, SOLD_KEY)
  client:close()
  return sold == UNITS and 0 or 1
end

workers.main(main, worker, DEFAULT_WORKERS)
