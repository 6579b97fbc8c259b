-- SPDX-License-Identifier: MIT
-- Runs inside the private nginx of bench/nginx.lua (a benchmark, not a test):
-- lock cycles from a content handler, one request doing n cycles back to back,
-- timed with core.now (CLOCK_MONOTONIC). Each handler answers
-- "cycles_per_s=<rate>".
--   /redislock?n=N         redislock over cosockets (redislock/ngx.lua: each
--                          call takes a pooled connection and puts it back)
--   /resty?n=N             Debian's lua-resty-redis 0.27 (require("nginx.redis")),
--                          as a request would use it: connect (pooled), SET NX
--                          PX, compare-and-delete by EVAL, set_keepalive
--   /resty-one?n=N         the same on one connection for all n cycles
--   /redislock-req, /resty-req   one cycle per request, as an application
--                          does (driven by ab with concurrent requests); the
--                          key is the worker's request number modulo 4096, so
--                          requests in flight together take different locks
-- The resty token comes from core.token (16 random bytes, hex), as
-- redislock's own, so the two send tokens of the same length and cost.
-- luacheck: read globals ngx
local core = require("redislock.core")
local redislock = require("redislock")
local redis = require("nginx.redis")

local M = {}

local TTL = 10
local RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"

local function connect(port)
  local red = redis:new()
  red:set_timeout(1000)
  assert(red:connect("127.0.0.1", port))
  return red
end

local function resty_cycle(red, key)
  local tok = core.token()
  assert(assert(red:set(key, tok, "NX", "PX", TTL * 1000)) == "OK", "SET NX found the lock taken")
  assert(assert(red:eval(RELEASE, 1, key, tok)) == 1, "the release found the lock not ours")
end

local function resty(port, n)
  local t0 = core.now()
  for _ = 1, n do
    local red = connect(port)
    resty_cycle(red, "bench:resty")
    assert(red:set_keepalive(10000, 16))
  end
  return n / (core.now() - t0)
end

local function resty_one(port, n)
  local red = connect(port)
  local t0 = core.now()
  for _ = 1, n do resty_cycle(red, "bench:resty-one") end
  local rate = n / (core.now() - t0)
  assert(red:set_keepalive(10000, 16))
  return rate
end

local client
local function with_redislock(port, n)
  client = client or redislock.new({ port = port })
  local t0 = core.now()
  for _ = 1, n do
    local lock = assert(client:acquire("bench", TTL))
    assert(lock:release())
  end
  return n / (core.now() - t0)
end

local HANDLERS = { redislock = with_redislock, resty = resty, ["resty-one"] = resty_one }

local seq = 0
local function next_key(kind)
  seq = seq + 1
  return "bench:" .. kind .. ":" .. seq % 4096
end

local PER_REQUEST = {
  ["redislock-req"] = function(port)
    client = client or redislock.new({ port = port })
    assert(assert(client:acquire(next_key("redislock"), TTL)):release())
  end,
  ["resty-req"] = function(port)
    local red = connect(port)
    resty_cycle(red, next_key("resty"))
    assert(red:set_keepalive(10000, 64))
  end,
}

--- The content handler: which one from the URI, n from the query string.
function M.handle(port)
  local one = PER_REQUEST[ngx.var.uri:sub(2)]
  if one then
    one(port)
    return ngx.say("ok")
  end
  local fn = HANDLERS[ngx.var.uri:sub(2)]
  local n = tonumber(ngx.var.arg_n) or 1000
  if not fn then return ngx.exit(404) end
  ngx.say(string.format("cycles_per_s=%.1f", fn(port, n)))
end

return M
