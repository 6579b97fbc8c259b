-- SPDX-License-Identifier: MIT
-- Leader election with three node processes and an observer.
--
-- Each node campaigns in the election "demo:scheduler"; the one that leads
-- runs three scheduler ticks, each a write guarded by its term (a fenced
-- RPUSH: a deposed leader's would be refused), then resigns, which hands
-- the lead to the next node at once. This process observes the election
-- and prints every change it hears; at the end it checks that the ticks
-- came from one leader at a time, terms growing, and that it heard every
-- leader in term order.
--
-- Run by hand (needs a redis-server; REDIS_URL, else 127.0.0.1:6379):
--  REDIS_URL=redis://127.0.0.1:6379 LUA_PATH="lua/?.lua;;" LUA_CPATH="build/lua5.4/?.so;;" \
--    lua5.4 examples/election.lua
-- It overwrites keys under demo:. Exit status 0 only when all of it held.

local redislock = require("redislock")
local core = require("redislock.core")

local NODES, TICKS = 3, 3
local client = redislock.new({ url = os.getenv("REDIS_URL") or "redis://127.0.0.1:6379" })
local election = client:election("demo:scheduler")

if arg[1] == "node" then
  local name = "node-" .. arg[2]
  local lead = assert(election:campaign(name, 5, { wait = 30 }))
  for i = 1, TICKS do
    assert(lead:fenced():rpush("demo:ticks", string.format("%.0f %s %d", lead.term, name, i)))
    core.sleep(0.1)
  end
  assert(lead:resign())
  return
end

assert(client:command("DEL", "demo:ticks"))
local heard = {}
local nodes
assert(election:observe(function(leader)
  if leader then
    print(string.format("observer: %s leads (term %.0f)", leader.value, leader.term))
    heard[#heard + 1] = leader
  elseif nodes then
    print("observer: nobody leads")
  end
  if not nodes then -- the election is quiet: start the nodes
    nodes = {}
    local lua = arg[-1]
    for i = 1, NODES do nodes[i] = assert(io.popen(lua .. " " .. arg[0] .. " node " .. i)) end
  end
  return #heard < NODES or leader ~= false
end, { wait = 30 }))
for _, p in ipairs(nodes) do p:close() end

-- The ticks, in the order Redis took them: one leader's run after another.
local ticks = client:command("LRANGE", "demo:ticks", 0, -1)
local ok, last_term, runs = #ticks == NODES * TICKS, 0, {}
for i, t in ipairs(ticks) do
  local term, name, n = t:match("^(%d+) (%S+) (%d+)$")
  term, n = tonumber(term), tonumber(n)
  if n == 1 then
    ok = ok and term > last_term
    runs[#runs + 1] = name
  else
    ok = ok and term == last_term and ticks[i - 1]:match("^%d+ (%S+)") == name
  end
  last_term = term
end
print(string.format("ticks: %d, by %s, one leader after another, terms growing: %s", #ticks,
                    table.concat(runs, ", "), ok and "yes" or "NO"))
local in_order = #heard == NODES
for i = 2, #heard do in_order = in_order and heard[i].term > heard[i - 1].term end
print(string.format("the observer heard %d leaders, in term order: %s", #heard, in_order and "yes" or "NO"))
os.exit(ok and in_order and 0 or 1)
