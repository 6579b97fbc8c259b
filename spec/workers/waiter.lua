-- SPDX-License-Identifier: MIT
-- Worker for the waiting specs: announces its PID (RPUSH pids), waits for a
-- lock, records its tag when it gets it (RPUSH order), holds it, releases it.
-- usage: waiter.lua <port | tls:port:folder> <key> <wait> <notify|poll> <fair|plain> <hold> <tag>
-- Prints "got <tag> <fence> <when>" (when: core.now() as it got the lock)
-- or "failed <tag> <error>".
local redislock = require "redislock"
local core = require "redislock.core"

local connect = require "spec.workers.connect"

local key, wait, mode, kind, hold, tag = arg[2], tonumber(arg[3]), arg[4], arg[5], tonumber(arg[6]), arg[7]
local client = redislock.new(connect(arg[1]))

local stat = assert(io.open("/proc/self/stat")):read("*l")
assert(client:command("RPUSH", "pids", stat:match("^%d+")))

local lock, err = client:acquire(key, 30, { wait = wait, wait_mode = mode, fair = kind == "fair" })
local got = core.now()
if not lock then
  print("failed " .. tag .. " " .. err)
  return
end
assert(client:command("RPUSH", "order", tag))
core.sleep(hold)
assert(lock:release())
print(string.format("got %s %d %.3f", tag, lock.fence, got))
