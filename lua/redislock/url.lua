-- SPDX-License-Identifier: MIT
--- redislock.url: connection URLs.
--
--   redis://[user:password@]host[:port][/db]     host may be [IPv6]
--   rediss://...                                 the same, over TLS (tls = true)
--   unix:///path[?db=N&password=P&username=U]
--
-- Percent-encoding is decoded in the user name and password, the unix path
-- and its password/username parameters; nowhere else.

local args = require("redislock.args")

local tonumber = tonumber
local string_char = string.char
local quote = args.quote

local _M = { _VERSION = args._VERSION }

args.own(debug.getinfo(1, "S").source)

local function unescape(s)
  return (s:gsub("%%(%x%x)", function(h) return string_char(tonumber(h, 16)) end))
end

local function url_db(s)
  if s == nil or s == "" then return nil end
  local db = s:match("^%d+$") and tonumber(s)
  if not db then return nil, "has a database that is not a whole number: " .. quote(s) end
  return db
end

-- Parses redis[s]://[user:password@]host[:port][/db] and unix:///path[?db=N].
-- Returns a table of connection fields, or nil and why.
local function parse_url(url)
  local scheme, rest = url:match("^(%a[%w+.-]*)://(.*)$")
  scheme = scheme and scheme:lower()
  if scheme == "unix" then
    local path, query = rest:match("^([^?]*)%??(.*)$")
    if path:sub(1, 1) ~= "/" then
      return nil, "needs an absolute path, as in unix:///run/redis.sock"
    end
    local t = { path = unescape(path) }
    for pair in query:gmatch("[^&]+") do
      local k, v = pair:match("^([^=]*)=(.*)$")
      if k == "db" then
        local db, why = url_db(v)
        if not db then return nil, why or "has an empty db parameter" end
        t.db = db
      elseif k == "password" or k == "username" then
        t[k] = unescape(v)
      else
        return nil, "has an unknown parameter " .. quote(k or pair)
      end
    end
    return t
  elseif scheme ~= "redis" and scheme ~= "rediss" then
    return nil, "must start with redis://, rediss:// or unix://, got " .. quote(url)
  end
  local authority, tail = rest:match("^([^/?#]*)(.*)$")
  local t = { tls = scheme == "rediss" or nil }
  local userinfo, hostport = authority:match("^(.*)@(.*)$")
  if userinfo then
    local user, pass = userinfo:match("^([^:]*):(.*)$")
    if not user then
      return nil, "needs a ':' before the password, as in redis://:secret@host or redis://user:secret@host"
    end
    if user ~= "" then t.username = unescape(user) end
    if pass ~= "" then t.password = unescape(pass) end
  else
    hostport = authority
  end
  local host, port = hostport:match("^%[([^%]]+)%]:?(%d*)$")
  if not host then host, port = hostport:match("^([^:]*):?(%d*)$") end
  if not host then return nil, "has a host and port that cannot be read: " .. quote(hostport) end
  if host ~= "" then t.host = host end
  if port ~= "" then t.port = tonumber(port) end
  local db = tail:match("^/(%d*)$")
  if not db and tail ~= "" then
    return nil, "must end in /<db number> after the host, got " .. quote(tail)
  end
  local why
  t.db, why = url_db(db)
  if why then return nil, why end
  return t
end

--- "host:port" for messages and names, as Redis writes node addresses
-- (an IPv6 host in brackets); address() reads it back.
function _M.where(host, port)
  return (host:find(":", 1, true) and "[" .. host .. "]" or host) .. ":" .. port
end

--- Parses "host:port", "[IPv6]:port" or a bare host (port default_port)
-- into host, port; or returns nil and why (a fragment).
function _M.address(s, default_port)
  local host, port = s:match("^%[([^%]]+)%]:?(%d*)$")
  if not host then host, port = s:match("^([^:%[%]]+):?(%d*)$") end
  if not host then return nil, "must be \"host:port\", got " .. quote(s) end
  port = port == "" and default_port or tonumber(port)
  if port < 1 or port > 65535 then return nil, "has a port outside 1..65535: " .. quote(s) end
  return host, port
end

--- Parses a URL into connection fields (host, port, path, username,
-- password, db, and tls = true for rediss://), or returns nil and why (a
-- fragment: "must start with ...").
_M.parse = parse_url

return _M
