-- SPDX-License-Identifier: MIT
-- Worker for the mutual-exclusion spec: read-modify-write of a shared Redis
-- counter, `rounds` times, with or without the lock. While inside, it also
-- counts how many workers are inside at once ("inside" key): more than one is
-- an overlap, which the lock must make impossible. With the lock, each
-- section appends its fence to the "fences" list.
-- usage: counter.lua <where (spec/workers/connect.lua)> <notify|poll|fair|resty|nolock> <rounds>
--                    <start_at (core.now seconds)> [<port of the counter's server>]
-- (notify, poll: with_lock with that wait_mode; fair: a fair lock; resty:
-- redislock.resty_lock's lock and unlock, as lua-resty-lock's callers). The
-- counter lives on the lock's server, or on the server at the last port (a
-- Redlock client has no single server for commands).
local redislock = require("redislock")
local core = require("redislock.core")

local connect = require("spec.workers.connect")

local mode, rounds, start_at = arg[2], tonumber(arg[3]), tonumber(arg[4])
local client = redislock.new(connect(arg[1], { timeout = 5 }))
local data = arg[5] and redislock.new({ port = tonumber(arg[5]) }) or client
local overlaps = 0

local function critical(lock)
  if assert(data:command("INCR", "inside")) > 1 then overlaps = overlaps + 1 end
  if lock then assert(data:command("RPUSH", "fences", lock.fence)) end
  local n = tonumber(assert(data:command("GET", "counter")))
  core.sleep(0.001) -- widen the race window so that a missing lock shows
  assert(data:command("SET", "counter", n + 1))
  assert(data:command("DECR", "inside"))
end

-- Start together, so the workers really compete.
local delay = start_at - core.now()
if delay > 0 then core.sleep(delay) end

for _ = 1, rounds do
  if mode == "resty" then
    local lock = assert(require("redislock.resty_lock"):new("locks", { client = client, timeout = 60, exptime = 10 }))
    assert(lock:lock("counter"))
    critical(lock.held)
    assert(lock:unlock() == 1)
  elseif mode ~= "nolock" then
    local fair = mode == "fair"
    client:with_lock("counter", 10, critical, { wait = 60, wait_mode = fair and "notify" or mode, fair = fair })
  else
    critical()
  end
end
print("overlaps " .. overlaps)
