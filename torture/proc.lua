-- SPDX-License-Identifier: MIT
-- What make torture's phases do to processes, by PID: pause one past a
-- time (SIGSTOP, then SIGCONT), and stop a phase's servers at its end
-- (keeping their logs first when the phase failed); and a phase's part of
-- a log that lasts longer than the phase (nginx's).
local helpers = require("spec.helpers")
local core = require("redislock.core")

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

--- The size of the file at path in bytes (0 when there is none).
function _M.size(path)
  local f = io.open(path, "rb")
  if not f then return 0 end
  local n = f:seek("end")
  f:close()
  return n
end

--- Copies what the file at path holds past its first from bytes (a
-- phase's part of a log another process writes on) into dest.
function _M.keep_log(path, from, dest)
  os.execute("tail -c +" .. (from + 1) .. " " .. q(path) .. " > " .. q(dest) .. " 2>/dev/null")
end

return _M
