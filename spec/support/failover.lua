-- SPDX-License-Identifier: MIT
-- What spec/30's failover-fence tests (plain Lua and OpenResty) share: cutting a replica
-- off its master, waiting for one to catch up, and comparing fences.
local helpers = require "spec.helpers"

local failover = {}

--- Sends signal sig ("STOP", "CONT", ...) to a server, by its PID.
function failover.signal(s, sig)
  assert(os.execute("kill -" .. sig .. " " .. s.pid))
end

--- Waits until replica has applied everything master wrote so far.
function failover.synced(master, replica)
  local want = tonumber(master:cli("INFO", "replication"):match("master_repl_offset:(%d+)"))
  assert(helpers.eventually(15, function()
    local info = replica:cli("INFO", "replication")
    local got = tonumber(info:match("slave_repl_offset:(%d+)") or "-1")
    return info:find("master_link_status:up", 1, true) and got >= want
  end), "the replica never caught up")
end

--- Cuts replica off master: it applies none of master's writes from now on
-- (SIGSTOP alone is not enough: what the master already sent would wait in
-- its socket and be applied after SIGCONT).
function failover.cut_off(master, replica)
  failover.signal(replica, "STOP")
  master:cli("CLIENT", "KILL", "TYPE", "replica")
end

--- Checks (busted's assert) that every fence in new is above the same
-- primitive's in old (tables of name -> fence).
function failover.above(new, old, what)
  for name, fence in pairs(old) do
    assert(new[name] and new[name] > fence,
           string.format("%s: %s fence %s is not above %d", what, name, tostring(new[name]), fence))
  end
end

--- The fences in a line "name=N name=N ..." (spec/support/ngx_app.lua's /fences).
function failover.parse(line)
  local t = {}
  for name, n in line:gmatch("(%S+)=(%d+)") do t[name] = tonumber(n) end
  return t
end

return failover
