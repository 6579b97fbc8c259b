-- SPDX-License-Identifier: MIT
-- Worker: takes a lock, holds it for some seconds, releases it.
-- usage: hold.lua <port> <key> <seconds>
local redislock = require "redislock"
local core = require "redislock.core"

local port, key, seconds = tonumber(arg[1]), arg[2], tonumber(arg[3])
local client = redislock.new({ port = port })
local lock = assert(client:acquire(key, 30, { wait = 10 }))
core.sleep(seconds)
assert(lock:release())
print("released " .. key)
