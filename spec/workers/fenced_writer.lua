-- SPDX-License-Identifier: MIT
-- Worker for the fencing specs: takes a lock (no renewal), waits until the
-- spec sets go:<who> on the data server (the spec may stop it past the
-- lock's TTL meanwhile), then writes to a resource that refuses a fence
-- lower than the highest it has seen (a hash on the data server: fence,
-- value). Once it holds the lock it sets writer:<who> to its PID there.
-- Prints "fence <n>", then "accepted" or "refused".
-- usage: fenced_writer.lua <where (spec/workers/connect.lua)> <key> <ttl> <data port> <who>
local redislock = require("redislock")
local core = require("redislock.core")

local connect = require("spec.workers.connect")

local FENCED_WRITE = [[
local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < seen then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
]]

local key, ttl, who = arg[2], tonumber(arg[3]), arg[5]
local client = redislock.new(connect(arg[1]))
local data = redislock.new({ port = tonumber(arg[4]) })
local lock = assert(client:acquire(key, ttl, { wait = 5, renew = false }))
local stat = assert(io.open("/proc/self/stat")):read("*l")
assert(data:command("SET", "writer:" .. who, stat:match("^%d+"))) -- its PID, for the spec's signals
print("fence " .. lock.fence)
io.stdout:flush()
-- Told when to write, not a fixed moment: on a loaded machine the spec
-- could see writer:<who> only after the moment had passed.
local deadline = core.now() + 30
while data:command("EXISTS", "go:" .. who) == 0 and core.now() < deadline do core.sleep(0.01) end
local ok = assert(data:command("EVAL", FENCED_WRITE, 1, "resource", lock.fence, who))
print(ok == 1 and "accepted" or "refused")
