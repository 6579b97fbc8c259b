-- SPDX-License-Identifier: MIT
-- Worker for the OpenResty Sentinel spec: GETs path from nginx on port, one
-- request after another, until `seconds` pass; prints each response's body
-- (or "err <status> <body>"), then "done".
-- usage: http_loop.lua <port> <path> <seconds> <start_at (core.now seconds)>
local core = require("redislock.core")
local http = require("spec.support.http")

local port, path, seconds, start_at = tonumber(arg[1]), arg[2], tonumber(arg[3]), tonumber(arg[4])
local delay = start_at - core.now()
if delay > 0 then core.sleep(delay) end
local stop_at = core.now() + seconds
while core.now() < stop_at do
  local ok, status, body = pcall(http.request, port, "GET", path, { timeout = 15 })
  if ok and status == 200 then
    io.write(body)
  else
    print("err " .. tostring(status) .. " " .. tostring(body):gsub("\n", " "))
    core.sleep(0.01)
  end
end
print("done")
