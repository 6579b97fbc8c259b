-- SPDX-License-Identifier: MIT
-- Worker: takes a lock, holds it for some seconds, releases it.
-- usage: hold.lua <port | tls:port:folder> <key> <seconds>
local redislock = require("redislock")
local core = require("redislock.core")

local connect = require("spec.workers.connect")

local key, seconds = arg[2], tonumber(arg[3])
local client = redislock.new(connect(arg[1]))
local lock = assert(client:acquire(key, 30, { wait = 10 }))
core.sleep(seconds)
assert(lock:release())
print("released " .. key)
