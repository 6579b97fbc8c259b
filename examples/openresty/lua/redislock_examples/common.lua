-- SPDX-License-Identifier: MIT
--- What the OpenResty examples share: one redislock client per nginx worker,
-- JSON answers, and redislock's error codes turned into HTTP statuses.

local redislock = require("redislock")

local error, ipairs, pairs, pcall, tostring, type = error, ipairs, pairs, pcall, tostring, type
local string_format, math_floor, math_huge = string.format, math.floor, math.huge
local table_concat, table_sort = table.concat, table.sort

local _M = {}

-- One client per worker, made when the worker first requires this module. It
-- keeps no connection between calls (each call borrows one from nginx's
-- cosocket pool and puts it back), so all the worker's requests share it.
-- nginx clears the environment of its workers: they see REDIS_URL only when
-- nginx.conf says `env REDIS_URL;` in its main context. Without that line
-- os.getenv returns nil here and the client uses 127.0.0.1:6379. A URL that
-- names a host (not an IP address) also needs a `resolver` in nginx.conf.
-- Its metrics add up in the shared dict redislock_metrics, which GET /metrics
-- serves (example (d); redislock.conf declares the dict).
-- A worker opens at most pool_size connections for its calls, and
-- wait_connections (2 by default) for the waits that block, however many
-- requests it serves: the requests waiting for one lock queue in the worker,
-- and one of them waits on Redis for all (coalesce, on by default; the
-- benchmark turns it off with REDISLOCK_COALESCE=off to compare).
local url = os.getenv("REDIS_URL")
_M.client = redislock.new{ url = url ~= "" and url or nil, pool_size = 16, keepalive_timeout = 60,
                           coalesce = os.getenv("REDISLOCK_COALESCE") ~= "off",
                           metrics = require("redislock.metrics").shared("redislock_metrics") }

------------------------------------------------------------------------------
-- JSON: lua-cjson when nginx has it (OpenResty does; Debian's lua module does
-- not), else a small encoder for the flat objects these examples send.

local has_cjson, cjson = pcall(require, "cjson.safe")

local ESCAPES = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }

local function escape(c)
  return ESCAPES[c] or string_format("\\u%04x", c:byte())
end

local function encode_value(v)
  local t = type(v)
  if t == "string" then
    return '"' .. v:gsub('[%c"\\]', escape) .. '"'
  elseif t == "number" then
    if v ~= v or v == math_huge or v == -math_huge then
      error("json: cannot encode " .. tostring(v))
    end
    if v == math_floor(v) and v > -2^53 and v < 2^53 then return string_format("%d", v) end
    return string_format("%.14g", v)
  elseif t == "boolean" then
    return tostring(v)
  end
  error("json: cannot encode a " .. t)
end

--- A flat table (string keys; string, number or boolean values) as a JSON
-- object. The small encoder sorts the keys.
function _M.json(obj)
  if has_cjson then return (assert(cjson.encode(obj))) end
  local keys = {}
  for k in pairs(obj) do keys[#keys + 1] = k end
  table_sort(keys)
  local parts = {}
  for i, k in ipairs(keys) do
    parts[i] = encode_value(k) .. ":" .. encode_value(obj[k])
  end
  return "{" .. table_concat(parts, ",") .. "}"
end

------------------------------------------------------------------------------
-- Answers and errors

--- The code word of a redislock error message ("busy", "lost", "connection",
-- "redis"), or nil for anything else.
function _M.code(err)
  return type(err) == "string" and err:match("^(%a+): ") or nil
end

--- Runs a plain Redis command on the shared client; returns the reply (a nil
-- reply is false) or raises the "connection: ..." / "redis: ..." message,
-- which run() answers with 503.
function _M.redis(...)
  local reply, err = _M.client:command(...)
  if reply == nil then error(err, 0) end
  return reply
end

--- Sends status and body (a table is sent as JSON, a string as it is) with
-- more headers, and X-Worker (the PID of the nginx worker that answered: the
-- locks work across workers as across machines), and ends the request. In an
-- access handler too:
-- ngx.exit(ngx.HTTP_OK) after the body ends the whole request, where
-- ngx.exit(ngx.OK) would go on to the content phase.
function _M.send(status, body, headers)
  ngx.status = status
  ngx.header["Content-Type"] = "application/json"
  ngx.header["X-Worker"] = ngx.worker.pid()
  for k, v in pairs(headers or {}) do ngx.header[k] = v end
  ngx.say(type(body) == "table" and _M.json(body) or body)
  return ngx.exit(ngx.HTTP_OK)
end

--- Runs handler(), which returns status, body[, headers] to answer the
-- request, or nothing to let it go on to the next phase. A redislock error it
-- raises ("connection: ...", "redis: ...") becomes 503 with the error text;
-- anything else is logged and answered with 500.
function _M.run(handler)
  local ok, status, body, headers = pcall(handler)
  if not ok then
    local err, code = status, _M.code(status)
    if code == "connection" or code == "redis" then
      return _M.send(503, { error = code, message = err }, { ["Retry-After"] = "1" })
    end
    ngx.log(ngx.ERR, tostring(err))
    return _M.send(500, { error = "internal", message = "see the error log" })
  end
  if status then return _M.send(status, body, headers) end
end

return _M
