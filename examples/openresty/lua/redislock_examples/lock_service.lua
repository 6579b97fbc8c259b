-- SPDX-License-Identifier: MIT
--- Example (b): locks as an HTTP service, for programs that speak HTTP but
-- not Redis (a shell script, a job in another language).
--
--     POST   /lock/<key>[?ttl=seconds&wait=seconds]
--            200 {"key","token","fence","ttl"}  taken; keep the token
--            409 {"error":"busy","message":...}  another owner holds it
--     DELETE /lock/<key>?token=<token>
--            200 {"key","released":true}          released
--            409 {"error":"lost","message":...}  not ours (expired, released, or taken)
--
-- 400 for a bad key, ttl, wait or token; 503 when Redis cannot be reached.
-- ttl defaults to 10 s (at most 3600), wait to 0 (at most 10).

local common = require("redislock_examples.common")

local error, pcall, tonumber, tostring, type = error, pcall, tonumber, tostring, type
local string_format = string.format
local client, run = common.client, common.run

local _M = {}

local DEFAULT_TTL, MAX_TTL, MAX_WAIT = 10, 3600, 10

-- A query argument in seconds: default when absent, else a number in
-- (0, max] (or [0, max] when zero_ok); nil and a message when it is not.
local function seconds(args, name, default, max, zero_ok)
  local raw = args[name]
  if raw == nil then return default end
  local v = type(raw) == "string" and tonumber(raw)
  if not v or v > max or v < 0 or (v == 0 and not zero_ok) then
    return nil, string_format("%s must be a number of seconds, %s to %d", name, zero_ok and "0" or "above 0", max)
  end
  return v
end

-- An argument error raised by redislock ("...: bad argument #1 to 'acquire'
-- (...)") without the source position in front.
local function argument_message(err)
  return (tostring(err):gsub("^[^\n]-:%d+: ", ""))
end

local function bad_request(message)
  return 400, { error = "bad request", message = message }
end

local function take(key, args)
  local ttl, terr = seconds(args, "ttl", DEFAULT_TTL, MAX_TTL, false)
  if not ttl then return bad_request(terr) end
  local wait, werr = seconds(args, "wait", 0, MAX_WAIT, true)
  if not wait then return bad_request(werr) end
  -- pcall: a key redislock refuses (e.g. one starting with "}") raises.
  local ok, lock, err = pcall(client.acquire, client, key, ttl, { wait = wait })
  if not ok then return bad_request(argument_message(lock)) end
  if not lock then
    if common.code(err) == "busy" then return 409, { error = "busy", message = err } end
    error(err, 0)  -- connection or redis: 503
  end
  -- The lock object is dropped here. That is fine: garbage collection never
  -- releases a lock; it lives in Redis until DELETE or its TTL.
  return 200, { key = lock.key, token = lock.token, fence = lock.fence, ttl = ttl }
end

local function give_back(key, args)
  local token = args.token
  if type(token) ~= "string" then
    return bad_request("token=<the token POST returned> expected")
  end
  -- The lock was taken by an earlier request, maybe on another worker: a lock
  -- object is made from its key and token. pcall: from_token raises on a key
  -- or token it refuses (the token must be 32 hex digits).
  local ok, lock = pcall(client.from_token, client, key, token)
  if not ok then return bad_request(argument_message(lock)) end
  local released, err = lock:release()
  if not released then
    if common.code(err) == "lost" then return 409, { error = "lost", message = err } end
    error(err, 0)  -- connection or redis: 503
  end
  return 200, { key = key, released = true }
end

--- content_by_lua for location /lock/.
function _M.handle()
  return run(function()
    local key = ngx.var.uri:match("^/lock/(.+)$")  -- decoded: /lock/a%20b is "a b"
    if not key then return 404, { error = "not found", message = "use /lock/<key>" } end
    local method = ngx.req.get_method()
    if method == "POST" then
      return take(key, ngx.req.get_uri_args())
    elseif method == "DELETE" then
      return give_back(key, ngx.req.get_uri_args())
    end
    return 405, { error = "method not allowed", message = "POST or DELETE" }, { Allow = "POST, DELETE" }
  end)
end

return _M
