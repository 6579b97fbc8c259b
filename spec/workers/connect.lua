-- SPDX-License-Identifier: MIT
-- The connection options a worker's first argument names: a port,
-- tls:<port>:<certificate folder> for a TLS server made by spec/helpers.lua
-- (mutual TLS, verified as "localhost"), <host:port>,...:<master> for the
-- master a Sentinel group names, cluster:<host:port>,... for a Redis
-- Cluster's seeds, or redlock:<url>,... for Redlock's servers. extra is
-- merged over them.
return function(where, extra)
  local o = {}
  local port, dir = where:match("^tls:(%d+):(.+)$")
  local sentinels, master = where:match("^(.+:%d+):(%a+)$")
  local seeds = where:match("^cluster:(.+)$")
  local servers = where:match("^redlock:(.+)$")
  if servers then
    o.redlock = {}
    for u in servers:gmatch("[^,]+") do o.redlock[#o.redlock + 1] = u end
  elseif seeds then
    o.cluster = {}
    for a in seeds:gmatch("[^,]+") do o.cluster[#o.cluster + 1] = a end
  elseif sentinels then
    o.sentinels, o.master = {}, master
    for a in sentinels:gmatch("[^,]+") do o.sentinels[#o.sentinels + 1] = a end
  elseif port then
    o.host, o.port = "localhost", tonumber(port)
    o.tls = { ca = dir .. "/ca.crt", cert = dir .. "/client.crt", key = dir .. "/client.key" }
  else
    o.port = assert(tonumber(where), "a port or tls:<port>:<folder> expected")
  end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end
