-- SPDX-License-Identifier: MIT
--- Example (a): a guard in the access phase that lets one request at a time
-- through per order, as a Koa or Fastify middleware does around
-- `await next()`. redislock.conf wires it up:
--
--     location /orders/ {
--         access_by_lua_block  { require("redislock_examples.orders").guard() }
--         content_by_lua_block { require("redislock_examples.orders").work() }
--         log_by_lua_block     { require("redislock_examples.orders").release() }
--     }
--
-- The content handler could as well be a proxy_pass to your backend: the guard
-- does not care what runs behind it.
--
-- Where the lock is released, and why there. It must be held until the
-- response is complete, and released however the request ends. The access
-- handler takes it and keeps it in ngx.ctx, which lives as long as the
-- request. The one phase that runs after every response (after a content
-- handler that raised, a client that went away, a backend that timed out) is
-- the log phase; but log_by_lua has no cosockets, so no Redis I/O can be done
-- there (redislock raises if asked). The log handler therefore hands the lock
-- to a zero-delay timer, ngx.timer.at(0, ...): it runs right after the
-- request, has cosockets, and releases the lock. What follows from that:
--
-- * The release lands a moment after the client got its response. A client
--   that sends its next request for the same order at once may find the lock
--   still held, so the guard waits a little (WAIT) before it answers 409.
-- * If the timer cannot be made (the worker is shutting down, too many
--   timers pending) the lock is left to expire by its TTL: make TTL longer
--   than a guarded request can take (with proxy_pass: proxy_read_timeout).
-- * An internal redirect (ngx.exec, error_page, try_files to another location)
--   starts ngx.ctx afresh, and the lock is again left to its TTL: keep them
--   out of a guarded location.
--
-- When the guarded work is your own Lua code, none of this is needed: do it
-- inside client:with_lock in the content handler, as report.lua does.

local common = require("redislock_examples.common")

local error, tonumber, tostring = error, tonumber, tostring
local client, redis, run = common.client, common.redis, common.run

local _M = {}

local TTL = 10   -- seconds: longer than any request to /orders/ may take
local WAIT = 2   -- seconds a request waits for the order's lock before 409
local MAX_WORK = 5

-- The order id in /orders/<id> or /unguarded/orders/<id>.
local function order_id()
  return ngx.var.uri:match("/orders/([%w_-]+)$")
end

local NOT_FOUND = { error = "not found", message = "use /orders/<id>; ids are letters, digits, _ and -" }

--- access_by_lua: takes the lock "order:<id>" for POST, PUT, PATCH and DELETE
-- (reads pass freely) and keeps it in ngx.ctx.order_lock; answers 409 when
-- another request still holds it after WAIT seconds, 503 when Redis cannot be
-- reached.
function _M.guard()
  return run(function()
    local method = ngx.req.get_method()
    if method == "GET" or method == "HEAD" then return end
    local id = order_id()
    if not id then return 404, NOT_FOUND end
    local lock, err = client:acquire("order:" .. id, TTL, { wait = WAIT })
    if not lock then
      if common.code(err) == "busy" then
        return 409, { error = "busy", message = err }, { ["Retry-After"] = "1" }
      end
      error(err, 0)  -- connection or redis: 503
    end
    ngx.ctx.order_lock = lock
    -- Returns nothing: the request goes on to the content phase, holding the lock.
  end)
end

-- Timer callback: releases the lock the request held. `premature` is true
-- when the worker is shutting down; the release is still worth trying.
local function release_now(_premature, lock)
  local ok, err = lock:release()
  if not ok then
    -- lost: it outlived its TTL, and the work may have overlapped another's.
    ngx.log(common.code(err) == "lost" and ngx.WARN or ngx.ERR, "order guard: ", err)
  end
end

--- log_by_lua: hands the request's lock, if it took one, to a timer that
-- releases it (the log phase itself has no cosockets).
function _M.release()
  local lock = ngx.ctx.order_lock
  if not lock then return end
  ngx.ctx.order_lock = nil
  local ok, err = ngx.timer.at(0, release_now, lock)
  if not ok then
    ngx.log(ngx.ERR, "order guard: cannot release ", tostring(lock), " (", err, "); it expires by its TTL")
  end
end

--- content_by_lua: the work behind the guard. GET answers the order's update
-- count. POST is a read-modify-write of that count with a pause between the
-- read and the write (?work=seconds, default 0.1): two requests in here at
-- once would both read n and both write n + 1, and one update would be lost.
function _M.work()
  return run(function()
    local id = order_id()
    if not id then return 404, NOT_FOUND end
    local key = "example:order:" .. id .. ":updates"
    local method = ngx.req.get_method()
    if method == "GET" or method == "HEAD" then
      return 200, { order = id, updates = tonumber(redis("GET", key)) or 0 }
    elseif method ~= "POST" then
      return 405, { error = "method not allowed", message = "GET or POST" }, { Allow = "GET, HEAD, POST" }
    end
    local work = ngx.var.arg_work and tonumber(ngx.var.arg_work) or 0.1
    if not (work and work >= 0 and work <= MAX_WORK) then
      return 400, { error = "bad request", message = "work must be 0 to " .. MAX_WORK .. " seconds" }
    end
    local n = tonumber(redis("GET", key)) or 0
    ngx.sleep(work)
    redis("SET", key, n + 1)
    local lock = ngx.ctx.order_lock  -- nil in /unguarded/orders/
    return 200, { order = id, updates = n + 1, fence = lock and lock.fence or nil }
  end)
end

return _M
