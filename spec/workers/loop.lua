-- SPDX-License-Identifier: MIT
-- Worker for the topology specs: loops with_lock (waiting) on one key until
-- `seconds` pass, each section a few milliseconds long. Prints one line per
-- section that returned ok, "ok <enter> <exit> <port> <fence>" (core.now()
-- times; port: the node the client sent it to, the master behind Sentinel
-- or the owner of the key's slot in a cluster, 0 if unknown), one per error, "err
-- <message>", and "done" at the end. With "elect", it campaigns in the
-- election named key instead (with_leadership), and the fence is the term.
-- usage: loop.lua <where (spec/workers/connect.lua)> <key> <seconds> <start_at (core.now seconds)> [elect]
local redislock = require("redislock")
local core = require("redislock.core")

local connect = require("spec.workers.connect")

local key, seconds, start_at, elect = arg[2], tonumber(arg[3]), tonumber(arg[4]), arg[5] == "elect"
local client = redislock.new(connect(arg[1], { timeout = 2 }))
local t = client._transport
local election = elect and client:election(key)
local slot = core.lock_slot(elect and "election:" .. key or key)

-- The node a section ran on; 0 when the client's slot table names none
-- right now (a refresh during a failover may find the slot without an
-- owner: CLUSTER SLOTS leaves it out until a replica takes over).
local function port()
  if t._slots then
    local owner = t._slots[slot]
    return owner and owner.port or 0
  end
  return t._port
end

local delay = start_at - core.now()
if delay > 0 then core.sleep(delay) end
local stop_at = core.now() + seconds
while core.now() < stop_at do
  local enter, leave, on, fence
  local function section(fenced)
    enter = core.now()
    on = port() or 0
    fence = fenced
    core.sleep(0.002)
    leave = core.now()
  end
  local ok, err
  if election then
    ok, err = pcall(election.with_leadership, election, "w", 2, function(lead) section(lead.term) end, { wait = 5 })
  else
    ok, err = pcall(client.with_lock, client, key, 2, function(lock) section(lock.fence) end, { wait = 5 })
  end
  if ok then
    print(string.format("ok %.6f %.6f %d %d", enter, leave, on, fence))
  else
    print("err " .. tostring(err):gsub("\n", " "))
    core.sleep(0.01)
  end
end
client:close()
print("done")
