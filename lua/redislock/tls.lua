-- SPDX-License-Identifier: MIT
--- redislock.tls: the `tls` option of redislock.new, checked once for both
-- transports.
--
--   tls = true                          TLS, verified against the system store
--   tls = { ca =, cert =, key =, server_name =, verify = true }
--   url = "rediss://..."                TLS (the `tls` table adds details)
--
-- Verification (the certificate chain and that the certificate names the
-- server: server_name, else the host; an address matches IP SANs) is on
-- unless verify = false. The files are read at new() (by the C core's
-- transport, or by check_files for OpenResty's), so a missing or unreadable
-- file, or a key that does not match its certificate, is a bad argument there
-- and then.

local args = require("redislock.args")
local core = require("redislock.core")

local pairs, pcall, tostring, type = pairs, pcall, tostring, type
local string_format = string.format
local argerror = args.argerror

local _M = { _VERSION = args._VERSION }

args.own(debug.getinfo(1, "S").source)

local FIELDS = { ca = "string", cert = "string", key = "string", server_name = "string", verify = "boolean" }

-- Raises err, a bad argument to a core function, as a bad argument to 'new'.
local function reraise(err)
  argerror(1, "new", (tostring(err):match("^bad argument #1 to '[^']*' %((.*)%)$") or tostring(err)))
end

--- core.new(fields), with a bad argument it raises (a TLS file: "tls.ca:
-- cannot read ...") raised as one to 'new'.
function _M.core_new(fields)
  local ok, client = pcall(core.new, fields)
  if not ok then reraise(client) end
  return client
end

--- Reads the files of settings t as core.new would, raising a bad argument
-- to 'new' when one is missing, unreadable or mismatched. For OpenResty,
-- whose handshake is nginx's but whose files are the same.
function _M.check_files(t)
  local ok, err = pcall(core.check_tls, { tls = t })
  if not ok then reraise(err) end
end

--- The TLS settings for new(): nil (plaintext) or a table with the fields
-- above (verify always set). tls is the option's value; scheme_tls is true
-- when the URL said rediss://; path is the unix socket, if any. Raises a bad
-- argument to 'new' on anything inconsistent.
function _M.settings(tls, scheme_tls, path)
  if tls == nil then tls = scheme_tls or false end
  if tls == false then
    if scheme_tls then argerror(1, "new", "option 'tls' = false contradicts the rediss:// URL") end
    return nil
  end
  local t = { verify = true }
  if type(tls) == "table" then
    for name, value in pairs(tls) do
      local want = FIELDS[name]
      if not want then
        argerror(1, "new", string_format("option 'tls' has an unknown field %s (known: ca, cert, key,"
          .. " server_name, verify)", args.quote(tostring(name))))
      end
      if type(value) ~= want then
        argerror(1, "new", string_format("field 'tls.%s' must be a %s, got %s", name, want, type(value)))
      end
      if want == "string" and (value == "" or value:find("\0", 1, true)) then
        argerror(1, "new", string_format("field 'tls.%s' must be a non-empty string without NUL bytes", name))
      end
      t[name] = value
    end
    if (t.cert == nil) ~= (t.key == nil) then
      argerror(1, "new", "fields 'tls.cert' and 'tls.key' go together (a client certificate and its key)")
    end
  elseif tls ~= true then
    argerror(1, "new", "option 'tls' must be a boolean or a table, got " .. type(tls))
  end
  if path then
    argerror(1, "new", "option 'tls' needs a TCP host: Redis serves TLS on TCP ports, not on unix sockets")
  end
  return t
end

_M.OPTIONS = FIELDS -- the options' names (spec/40 holds the reference against them)

return _M
