-- SPDX-License-Identifier: MIT
-- What make torture's phases do to processes, by PID: pause one past a
-- time (SIGSTOP, then SIGCONT), and stop a phase's servers at its end
-- (keeping their logs first when the phase failed).
local helpers = require "spec.helpers"
local core = require "redislock.core"

local q = helpers.sh_quote

local _M = {}

--- Pauses the process pid for seconds: SIGSTOP, then SIGCONT.
function _M.pause(pid, seconds)
  os.execute("kill -STOP " .. pid .. " 2>/dev/null")
  core.sleep(seconds)
  os.execute("kill -CONT " .. pid .. " 2>/dev/null")
end

--- Pauses server (a helpers Server: pid, port) for `seconds`, and returns
-- the log line that says so, naming it as what ("master", "replica" ...).
function _M.pause_server(what, server, seconds)
  _M.pause(server.pid, seconds)
  return string.format("%s :%d paused (SIGSTOP) for %.2f s", what, server.port, seconds)
end

--- Stops servers (helpers Servers, some maybe paused), by PID; with keep (a
-- folder), copies each one's log there first, as redis-<port>.log.
function _M.stop_servers(servers, keep)
  for _, s in ipairs(servers) do
    if keep then os.execute("cp " .. q(s.dir .. "/redis.log") .. " " .. q(keep .. "/redis-" .. s.port .. ".log")) end
    if s.pid then os.execute("kill -CONT " .. s.pid .. " 2>/dev/null") end
    s:stop()
  end
end

return _M
