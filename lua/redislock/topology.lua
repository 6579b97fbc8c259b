-- SPDX-License-Identifier: MIT
--- redislock.topology: the options of redislock.new that say how a client
-- reaches Redis beyond one server (sentinels and master, cluster, redlock),
-- checked once, and the transport they make: redislock/sentinel.lua,
-- redislock/cluster.lua, redislock/redlock.lua, or one node's
-- (redislock/transport.lua).

local args = require("redislock.args")
local cluster = require("redislock.cluster")
local core = require("redislock.core")
local redlock = require("redislock.redlock")
local sentinel = require("redislock.sentinel")
local tls = require("redislock.tls")
local transport = require("redislock.transport")
local url = require("redislock.url")

local ipairs, type = ipairs, type
local string_format = string.format
local argerror, is_whole = args.argerror, args.is_whole

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)


-- The sentinels or cluster option (name): a non-empty list of "host:port"
-- (default port default_port) or { host =, port = }; returns { { host =,
-- port = }, ... }.
local function address_list(name, list, default_port)
  if type(list) ~= "table" or #list == 0 then
    argerror(1, "new", string_format("option '%s' must be a non-empty list of \"host:port\"", name))
  end
  local out = {}
  for i, s in ipairs(list) do
    local host, port
    if type(s) == "string" then
      host, port = url.address(s, default_port)
      if not host then argerror(1, "new", string_format("option '%s' item %d %s", name, i, port)) end
    elseif type(s) == "table" and type(s.host) == "string" and s.host ~= "" then
      host, port = s.host, s.port or default_port
      if not is_whole(port, 1, 65535) then
        argerror(1, "new", string_format("option '%s' item %d: port must be a whole number in 1..65535", name,
                                         i))
      end
    else
      argerror(1, "new", string_format("option '%s' item %d must be \"host:port\" or { host =, port = }", name,
                                       i))
    end
    if host:find("\0", 1, true) then
      argerror(1, "new", string_format("option '%s' item %d must not contain NUL bytes", name, i))
    end
    out[i] = { host = host, port = port }
  end
  return out
end

-- Redlock's bound per server and call when the timeout option is not given:
-- short, as the algorithm wants (a slow server must not eat the validity).
local REDLOCK_TIMEOUT_MS = 200

-- The redlock option: a list of at least 3 servers, each a URL or a table
-- of host, port, path, username, password, db, tls; the client's own
-- username, password, db and tls are the defaults. Returns a list of node
-- fields (as transport.node takes them).
local function redlock_servers(opts, common)
  local list = opts.redlock
  if type(list) ~= "table" or #list < 3 then
    argerror(1, "new", "option 'redlock' must be a list of at least 3 servers (URLs or tables; a majority of 1 or"
      .. " 2 servers is all of them)")
  end
  local out = {}
  for i, item in ipairs(list) do
    local f
    if type(item) == "string" then
      local why
      f, why = url.parse(item)
      if not f then argerror(1, "new", string_format("option 'redlock' item %d %s", i, why)) end
    elseif type(item) == "table" then
      f = {}
      for _, name in ipairs({ "host", "port", "path", "username", "password", "db" }) do f[name] = item[name] end
      if f.host == nil and f.path == nil then
        argerror(1, "new", string_format("option 'redlock' item %d needs a host or a path", i))
      end
    else
      argerror(1, "new", string_format("option 'redlock' item %d must be a URL or a table, got %s", i, type(item)))
    end
    for _, name in ipairs({ "username", "password", "db" }) do
      if f[name] == nil then f[name] = common[name] end
    end
    args.check_server(f, function(field) return string_format("option 'redlock' item %d: %s", i, field) end)
    f.tls = tls.settings(type(item) == "table" and item.tls or opts.tls, f.tls, f.path)
    f.connect_timeout_ms, f.prefix, f.pool_size = common.connect_timeout_ms, common.prefix, common.pool_size
    f.keepalive_timeout_ms, f.wait_connections = common.keepalive_timeout_ms, common.wait_connections
    out[i] = f
  end
  return out
end

--- Checks that the topology options of opts (redislock.new's, already
-- checked for their types) go together; raises a bad argument to 'new'.
function _M.check(opts)
  if opts.sentinels ~= nil or opts.master ~= nil then
    if opts.sentinels == nil or opts.master == nil or opts.master == "" then
      argerror(1, "new", "options 'sentinels' and 'master' go together (the sentinels, and the name of the master"
                         .. " they watch)")
    end
    for _, name in ipairs({ "url", "host", "port", "path" }) do
      if opts[name] ~= nil then
        argerror(1, "new", string_format("option '%s' contradicts 'sentinels' (the sentinels name the master)", name))
      end
    end
    if opts.master:find("\0", 1, true) then argerror(1, "new", "option 'master' must not contain NUL bytes") end
    if opts.sentinel_username and not opts.sentinel_password then
      argerror(1, "new", "option 'sentinel_username' needs a 'sentinel_password'")
    end
  elseif opts.sentinel_username ~= nil or opts.sentinel_password ~= nil or opts.sentinel_tls ~= nil then
    argerror(1, "new", "options 'sentinel_username', 'sentinel_password' and 'sentinel_tls' need 'sentinels'")
  end
  if opts.redlock ~= nil then
    for _, name in ipairs({ "url", "host", "port", "path", "sentinels", "cluster" }) do
      if opts[name] ~= nil then
        argerror(1, "new", string_format("option '%s' contradicts 'redlock' (the list names the servers)", name))
      end
    end
  end
  if opts.cluster ~= nil then
    for _, name in ipairs({ "url", "host", "port", "path", "sentinels" }) do
      if opts[name] ~= nil then
        argerror(1, "new", string_format("option '%s' contradicts 'cluster' (the cluster says which node has a lock)",
                                         name))
      end
    end
    if opts.db ~= nil and opts.db ~= 0 then
      argerror(1, "new", "option 'db' must be 0 with 'cluster' (a cluster has one database)")
    end
  end
end

--- The transport for opts and the node fields c (redislock.new gathered
-- and checked them), and the sleep that goes with it. No I/O.
function _M.transport(opts, c)
  if opts.sentinels ~= nil then
    return sentinel.new(c, address_list("sentinels", opts.sentinels, 26379), opts.master, {
      username = opts.sentinel_username, password = opts.sentinel_password,
      tls = tls.settings(opts.sentinel_tls, nil, nil) })
  elseif opts.cluster ~= nil then
    return cluster.new(c, address_list("cluster", opts.cluster, 6379))
  elseif opts.redlock ~= nil then
    return redlock.new(redlock_servers(opts, c), c.timeout_ms or REDLOCK_TIMEOUT_MS)
  end
  return transport.node(c)
end

return _M
