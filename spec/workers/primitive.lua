-- SPDX-License-Identifier: MIT
-- Worker for the semaphore, read-write lock and multi-key lock specs: loops
-- on one primitive, counting on the server who is inside at once, so that
-- the spec can tell whether a limit was ever passed.
-- usage: primitive.lua <where (spec/workers/connect.lua)> <mode> <start_at (core.now seconds)> <args...>
--   sem <limit> <rounds> [hold] with_permit on semaphore "pool" for hold s
--                               (0.005); "inside" counts holders, "seen" lists
--                               the count at each entry
--   read|write <rounds> <hold>  with_read / with_write on "doc": "readers" and
--                               "writers" count holders; an entry that finds
--                               a writer beside it counts in "overlaps";
--                               "readers_seen" lists readers at each entry
--   stream <seconds> <hold>     read holds back to back on "doc" for seconds
--   multi <keys> <rounds>       with_lock on a list of keys ("a,b"), or on one
--                               key ("a"); "in:<key>" counts holders of each
--   permit <ttl>                takes a permit of "pool" (limit 1) and a read hold
--                               on "doc", each for ttl s without renewal, lists
--                               its pid in "holders" and sleeps (to be killed)
local redislock = require("redislock")
local core = require("redislock.core")

local connect = require("spec.workers.connect")

local mode, start_at = arg[2], tonumber(arg[3])
local client = redislock.new(connect(arg[1], { timeout = 5 }))
local overlaps = 0

local function cmd(...)
  return assert(client:command(...))
end

local delay = start_at - core.now()
if delay > 0 then core.sleep(delay) end

if mode == "sem" then
  local sem = client:semaphore("pool", tonumber(arg[4]))
  for _ = 1, tonumber(arg[5]) do
    sem:with_permit(10, function(permit)
      cmd("RPUSH", "seen", cmd("INCR", "inside"))
      cmd("RPUSH", "fences", permit.fence)
      core.sleep(tonumber(arg[6] or 0.005))
      cmd("DECR", "inside")
    end, { wait = 60 })
  end
elseif mode == "read" or mode == "write" then
  local rw, hold = client:rwlock("doc"), tonumber(arg[5])
  for _ = 1, tonumber(arg[4]) do
    if mode == "read" then
      rw:with_read(10, function()
        cmd("RPUSH", "readers_seen", cmd("INCR", "readers"))
        if tonumber(cmd("GET", "writers")) ~= 0 then overlaps = overlaps + 1 end
        core.sleep(hold)
        cmd("DECR", "readers")
      end, { wait = 60 })
    else
      rw:with_write(10, function(h)
        if cmd("INCR", "writers") ~= 1 or tonumber(cmd("GET", "readers")) ~= 0 then overlaps = overlaps + 1 end
        cmd("RPUSH", "wfences", h.fence)
        core.sleep(hold)
        cmd("DECR", "writers")
      end, { wait = 60 })
    end
  end
elseif mode == "stream" then
  local rw, hold = client:rwlock("doc"), tonumber(arg[5])
  local stop = core.now() + tonumber(arg[4])
  while core.now() < stop do
    rw:with_read(10, function() core.sleep(hold) end, { wait = 60 })
  end
elseif mode == "multi" then
  local keys = {}
  for k in arg[4]:gmatch("[^,]+") do keys[#keys + 1] = k end
  local target = #keys == 1 and keys[1] or keys
  for _ = 1, tonumber(arg[5]) do
    client:with_lock(target, 10, function()
      for _, k in ipairs(keys) do
        if cmd("INCR", "in:" .. k) ~= 1 then overlaps = overlaps + 1 end
      end
      core.sleep(0.002)
      for _, k in ipairs(keys) do cmd("DECR", "in:" .. k) end
    end, { wait = 60 })
  end
elseif mode == "permit" then
  local ttl = tonumber(arg[4])
  assert(client:semaphore("pool", 1):acquire(ttl))
  assert(client:rwlock("doc"):read(ttl))
  local pid = assert(io.open("/proc/self/stat")):read("*l"):match("^%d+")
  cmd("RPUSH", "holders", pid)
  core.sleep(60)
else
  error("unknown mode " .. tostring(mode))
end
print("overlaps " .. overlaps)
