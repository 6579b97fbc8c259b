-- SPDX-License-Identifier: MIT
-- Worker for the waiting specs: announces its PID (RPUSH pids), waits for a
-- lock, records its tag when it gets it (RPUSH order), holds it, releases it.
-- usage: waiter.lua <port | tls:port:folder> <key> <wait> <notify|poll> <fair|plain|nohand|renew|sem|write|read>
--                   <hold> <tag> [<ttl> [may-lose]]
-- (nohand: handoff = false; renew: renew = true; sem: a permit of semaphore
-- <key> of limit 1; write, read: a hold of read-write lock <key>; ttl: 30 s
-- unless given). Prints "got <tag> <fence> <when>" (when:
-- core.now() as it got the lock), with may-lose followed by " release:
-- <error>" when its release failed (the lock was lost meanwhile: else that
-- fails the worker); or "failed <tag> <error>".
local redislock = require("redislock")
local core = require("redislock.core")

local connect = require("spec.workers.connect")

local key, wait, mode, kind, hold, tag = arg[2], tonumber(arg[3]), arg[4], arg[5], tonumber(arg[6]), arg[7]
local ttl = tonumber(arg[8]) or 30
local client = redislock.new(connect(arg[1]))

local stat = assert(io.open("/proc/self/stat")):read("*l")
assert(client:command("RPUSH", "pids", stat:match("^%d+")))

local opts = { wait = wait, wait_mode = mode, fair = kind == "fair" }
if kind == "nohand" then opts.handoff = false end
if kind == "renew" then opts.renew = true end
local lock, err
if kind == "sem" then
  lock, err = client:semaphore(key, 1):acquire(ttl, opts)
elseif kind == "write" or kind == "read" then
  local rw = client:rwlock(key)
  lock, err = rw[kind](rw, ttl, opts)
else
  lock, err = client:acquire(key, ttl, opts)
end
local got = core.now()
if not lock then
  print("failed " .. tag .. " " .. err)
  return
end
assert(client:command("RPUSH", "order", tag))
core.sleep(hold)
local released, rerr = lock:release()
assert(released or arg[9] == "may-lose", rerr)
print(string.format("got %s %d %.3f%s", tag, lock.fence, got, released and "" or " release: " .. tostring(rerr)))
