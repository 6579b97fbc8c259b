-- SPDX-License-Identifier: MIT
-- Worker for the election spec (spec/38-election_spec.lua). Each mode
-- announces its PID on the server's "pids" list first.
-- usage: campaign.lua <port> <name> <mode> ...
--   loop <rounds> <start_at>: campaigns rounds times (with_leadership),
--     and while leading does a read-modify-write of the shared "counter",
--     counting on "inside" how many lead at once (more than one: an
--     overlap) and pushing its term on "terms"; prints "overlaps N"
--   lead <value> <ttl> [<resign after s>]: campaigns, prints "leads <term>
--     <core.now()>"; resigns after the given seconds ("resigned <now>"), or
--     else looks every 10 ms whether it still leads, and prints "lost
--     <term> <message>" once it does not (at most 60 s)
--   observe <seconds> [<changes>]: observes, and prints "saw <value>
--     <term>" (or "saw none") for each change, then "done"; it stops after
--     that many changes, if given
local redislock = require("redislock")
local core = require("redislock.core")

local port, name, mode = tonumber(arg[1]), arg[2], arg[3]
local client = redislock.new({ port = port, timeout = 5 })
local election = client:election(name)
assert(client:command("RPUSH", "pids", core.getpid()))

local function say(...)
  print(string.format(...))
  io.stdout:flush()
end

if mode == "loop" then
  local rounds, start_at = tonumber(arg[4]), tonumber(arg[5])
  local overlaps = 0
  local delay = start_at - core.now()
  if delay > 0 then core.sleep(delay) end
  for _ = 1, rounds do
    election:with_leadership("w" .. core.getpid(), 10, function(lead)
      if assert(client:command("INCR", "inside")) > 1 then overlaps = overlaps + 1 end
      assert(client:command("RPUSH", "terms", string.format("%.0f", lead.term)))
      local n = tonumber(client:command("GET", "counter") or 0)
      core.sleep(0.001) -- widen the race window so that a second leader shows
      assert(client:command("SET", "counter", n + 1))
      assert(client:command("DECR", "inside"))
    end, { wait = 60 })
  end
  say("overlaps %d", overlaps)
elseif mode == "lead" then
  local lead = assert(election:campaign(arg[4], tonumber(arg[5]), { wait = 30 }))
  say("leads %.0f %.6f", lead.term, core.now())
  if arg[6] then
    core.sleep(tonumber(arg[6]))
    assert(lead:resign())
    say("resigned %.6f", core.now())
  else
    local stop_at = core.now() + 60
    while core.now() < stop_at do
      local lost = lead:lost()
      if lost then
        say("lost %.0f %s", lead.term, lost)
        break
      end
      core.sleep(0.01)
    end
  end
elseif mode == "observe" then
  local left = tonumber(arg[5]) or math.huge
  assert(election:observe(function(leader)
    if leader then say("saw %s %.0f", leader.value, leader.term) else say("saw none") end
    left = left - 1
    return left > 0
  end, { wait = tonumber(arg[4]) }))
  say("done")
end
client:close()
