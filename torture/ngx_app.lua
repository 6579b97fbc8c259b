-- SPDX-License-Identifier: MIT
-- The OpenResty side of make torture: GET /section runs one section
-- (torture/section.lua) in an nginx worker, over cosockets, and appends its
-- log lines to the log the driver names (torture/ngx_driver.lua).
-- Query: key, mode, hold, wait, ttl, id, log, lock (a port, or sentinel=...:
-- section.client_opts), reg_port, and tls=1 when the lock server speaks TLS
-- only (checked against nginx's lua_ssl_trusted_certificate, as localhost).
local redislock = require "redislock"
local section = require "torture.section"

local ngx = ngx
local clients = {}

-- The worker's client for where, made once.
local function client(where, tls)
  if not clients[where] then clients[where] = redislock.new(section.client_opts(where, tls)) end
  return clients[where]
end

local _M = {}

function _M.section()
  local a = ngx.req.get_uri_args()
  local function log(line)
    local f = assert(io.open(a.log, "a"))
    f:write(line)
    f:close()
  end
  local c = client(a.lock, a.tls == "1")
  section.run({ key = a.key, mode = a.mode, hold = tonumber(a.hold), wait = tonumber(a.wait) }, a.id,
              tonumber(a.ttl), c.with_lock, c, client(a.reg_port), ngx.sleep, log)
  ngx.say("ok")
end

return _M
