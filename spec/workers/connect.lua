-- SPDX-License-Identifier: MIT
-- The connection options a worker's first argument names: a port, or
-- tls:<port>:<certificate folder> for a TLS server made by spec/helpers.lua
-- (mutual TLS, verified as "localhost"). extra is merged over them.
return function(where, extra)
  local o = {}
  local port, dir = where:match("^tls:(%d+):(.+)$")
  if port then
    o.host, o.port = "localhost", tonumber(port)
    o.tls = { ca = dir .. "/ca.crt", cert = dir .. "/client.crt", key = dir .. "/client.key" }
  else
    o.port = assert(tonumber(where), "a port or tls:<port>:<folder> expected")
  end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end
