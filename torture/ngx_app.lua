-- SPDX-License-Identifier: MIT
-- The OpenResty side of make torture: GET /section runs one section as
-- torture/worker.lua does, in an nginx worker over cosockets, and appends the
-- same log lines to the log the driver names (torture/ngx_driver.lua drives it).
-- Query: key, ttl, hold, wait, mode, id, life_key, log, lock_port, reg_port.
local redislock = require "redislock"
local core = require "redislock.core"

local ngx = ngx
local clients = {}

local function client(port)
  if not clients[port] then clients[port] = redislock.new{ port = port, timeout = 0.5, connect_timeout = 0.5 } end
  return clients[port]
end

-- The register's fenced write, as in torture/worker.lua.
local FENCED = [[
if tonumber(ARGV[1]) <= tonumber(redis.call('GET', KEYS[1]) or '0') then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1
]]

local _M = {}

function _M.section()
  local a = ngx.req.get_uri_args()
  local key, ttl, hold, wait, mode = a.key, tonumber(a.ttl), tonumber(a.hold), tonumber(a.wait), a.mode
  local c, register = client(tonumber(a.lock_port)), client(tonumber(a.reg_port))
  local function log(line)
    local f = assert(io.open(a.log, "a"))
    f:write(line)
    f:close()
  end
  local started, entered = core.now(), false
  local ok, err = pcall(c.with_lock, c, key, ttl, function(lock)
    entered = true
    local life = register:command("GET", "lifetime") or "0"
    local event = a.id .. " " .. lock.fence .. " " .. life
    register:command("RPUSH", "history:" .. key, "in " .. event)
    log(string.format("E %.6f %s %d %s %s\n", core.now(), key, lock.fence, mode, life))
    local n = tonumber(register:command("GET", "count:" .. key)) or 0
    ngx.sleep(hold)
    register:command("SET", "count:" .. key, n + 1)
    local accepted = register:command("EVAL", FENCED, 1, "fence:" .. key .. ":" .. life, lock.fence)
    register:command("RPUSH", "history:" .. key, "out " .. event)
    log(string.format("X %.6f %s %d %s\n", core.now(), key, lock.fence, accepted == 1 and "ok" or "stale"))
  end, { wait = wait, wait_mode = mode == "fair" and "notify" or mode, fair = mode == "fair" })
  if not ok then
    local msg = tostring(err)
    local code = msg:match("^(%a+):") or "uncoded"
    if entered then
      log(string.format("L %.6f %s %s %s\n", core.now(), key, code, (msg:gsub("\n", " "))))
    else
      log(string.format("F %.6f %s %s %.3f %.3f %s\n", core.now(), key, code, core.now() - started, wait,
                        (msg:gsub("\n", " "))))
    end
  end
  ngx.say("ok")
end

return _M
