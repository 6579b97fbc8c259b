-- SPDX-License-Identifier: MIT
-- spec/47's handlers under nginx: every worker's client counts into one
-- redislock.metrics over the shared dict `redislock_metrics`, which
-- GET /metrics renders (the figures of both workers).
--   /hold?key=&ttl=&wait=&hold=  with_lock for hold seconds: 200 "<worker pid>", or 409 "<busy message>"
--   /lose?key=                   a lock of 0.1 s, not renewed, released 0.25 s later: 200 "<lost message>"
--   /dead?key=                   an acquire from a client of a server that is not there: 503 "<message>"
--   /metrics[?delay=s]           the figures, after delay seconds
local redislock = require("redislock")

local _M = {}

local metrics_mod = require("redislock.metrics")
local metrics = metrics_mod.shared("redislock_metrics", { held_too_long = 0.5 })
local clients = {}

local function client(url)
  if not clients[url] then clients[url] = redislock.new{ url = url, metrics = metrics, timeout = 1 } end
  return clients[url]
end

local function answer(status, body)
  ngx.status = status
  ngx.say(body)
end

function _M.hold()
  local a = ngx.req.get_uri_args()
  local c = client(ngx.var.redis_url)
  local ok, err = pcall(c.with_lock, c, a.key, tonumber(a.ttl) or 5, function()
    ngx.sleep(tonumber(a.hold) or 0)
  end, { wait = tonumber(a.wait) or 0 })
  if ok then return answer(200, ngx.worker.pid()) end
  answer(tostring(err):find("^busy:") and 409 or 503, err)
end

function _M.lose()
  local c = client(ngx.var.redis_url)
  local lock = assert(c:acquire(ngx.req.get_uri_args().key, 0.1))
  ngx.sleep(0.25)
  local ok, err = lock:release()
  answer(ok and 500 or 200, err or "released")
end

function _M.dead()
  local _, err = client(ngx.var.dead_url):acquire(ngx.req.get_uri_args().key, 5)
  answer(503, err)
end

function _M.metrics()
  local delay = tonumber(ngx.req.get_uri_args().delay)
  if delay then ngx.sleep(delay) end
  assert(metrics_mod.shared("redislock_metrics") == metrics) -- the worker's, made once
  metrics_mod.serve("redislock_metrics")
end

return _M
