-- SPDX-License-Identifier: MIT
-- Drives one OpenResty worker slot of make torture: sections picked as
-- torture/section.lua picks them, each one GET /section on the private nginx
-- (torture/ngx_app.lua runs it and writes the log), one after the other, until
-- the deadline; then the log's DONE line. The request on its way is in
-- <log>.req (when it was sent, by core.now(), and its path), so that one
-- that never comes back can be named (torture/run.lua); one that fails or
-- takes more than a minute ends the driver, naming it.
-- usage: ngx_driver.lua <nginx_port> <lock> <register_port> <id> <keys> <seconds> <ttl> <seed> <log>
local core = require("redislock.core")
local http = require("spec.support.http")
local section = require("torture.section")

local port, lock, reg_port, id = tonumber(arg[1]), arg[2], arg[3], arg[4]
local nkeys, seconds, ttl, seed, logfile = tonumber(arg[5]), tonumber(arg[6]), tonumber(arg[7]),
                                           tonumber(arg[8]), arg[9]
math.randomseed(seed)
assert(io.open(logfile, "w")):close()

-- The lock argument in a query string.
local escaped = lock:gsub("[^%w.-]", function(c) return string.format("%%%02X", c:byte()) end)

local deadline = core.now() + seconds
local seq = 0
while core.now() < deadline do
  local s = section.pick(nkeys, ttl, lock)
  seq = seq + 1
  local path = string.format("/section?key=%s&ttl=%g&hold=%.3f&wait=%.3f&mode=%s&id=%s&seq=%d&log=%s&lock=%s"
    .. "&reg_port=%s%s", s.key, ttl, s.hold, s.wait, s.mode, id, seq, logfile, escaped, reg_port,
    os.getenv("TORTURE_TLS_CA") and "&tls=1" or "")
  local sent = core.now()
  local req = assert(io.open(logfile .. ".req", "w"))
  req:write(string.format("%.6f %s\n", sent, path))
  req:close()
  local ok, status, body = pcall(http.request, port, "GET", path, { timeout = 60 })
  if not ok or status ~= 200 then
    error(string.format("GET %s: %s after %.1f s", path, ok and "status " .. status .. ": " .. body or status,
                        core.now() - sent), 0)
  end
end
local log = assert(io.open(logfile, "a"))
log:write("DONE\n")
log:close()
