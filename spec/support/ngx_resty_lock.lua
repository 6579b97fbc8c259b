-- SPDX-License-Identifier: MIT
-- spec/46's nginx handlers: code written against lua-resty-lock
-- (`require("resty.lock")`), run where the nginx's init swapped
-- redislock.resty_lock in and configured it. Counters live on the same
-- Redis, reached through a lock object's client. $instance names the nginx.
local core = require("redislock.core")
local redislock = require("redislock")
local resty_cache = require("spec.support.resty_cache")
local resty_lock = require("resty.lock")

local app = {}

local function arg_number(name, default)
  return tonumber(ngx.var["arg_" .. name]) or default
end

-- Ends the request with status and body (a line), saying which worker and
-- nginx served it.
local function reply(status, body)
  ngx.status = status
  ngx.header["x-worker"] = ngx.worker.pid()
  ngx.header["x-instance"] = ngx.var.instance
  ngx.say(body)
  return ngx.exit(status)
end

-- The client the configured locks use (a lock object's), for the counters.
local function data()
  return assert(resty_lock:new("locks")).client
end

local function cmd(...)
  return assert(data():command(...))
end

--- GET /section?key=k[&timeout=s][&exptime=s][&hold=s][&dict=d][&nolock=1]:
-- a read-modify-write of "counter:<k>" under lock(k) (none with nolock),
-- with hold seconds between the read and the write; "inside:<k>" counts
-- who is inside at once, "overlaps:<k>" how often it was above one ->
-- 200 "<elapsed> <fence>" | 409 "timeout" | 503 the error.
function app.section()
  local key = ngx.var.arg_key
  local lock = assert(resty_lock:new(ngx.var.arg_dict or "locks",
                                     { timeout = arg_number("timeout"), exptime = arg_number("exptime") }))
  local elapsed = 0
  if not ngx.var.arg_nolock then
    local err
    elapsed, err = lock:lock(key)
    if not elapsed then return reply(err == "timeout" and 409 or 503, err) end
  end
  if cmd("INCR", "inside:" .. key) > 1 then cmd("INCR", "overlaps:" .. key) end
  local v, err = data():command("GET", "counter:" .. key)
  assert(v ~= nil, err)
  local n = tonumber(v) or 0 -- false: none yet
  ngx.sleep(arg_number("hold", 0.001))
  cmd("SET", "counter:" .. key, n + 1)
  cmd("DECR", "inside:" .. key)
  local fence = lock.held and lock.held.fence or 0
  if not ngx.var.arg_nolock then
    local ok, uerr = lock:unlock()
    if ok ~= 1 then return reply(500, "unlock: " .. tostring(uerr)) end
  end
  return reply(200, string.format("%.3f %.0f", elapsed, fence))
end

--- GET /contract?key=k: one object through lua-resty-lock's contract;
-- each answer on a line -> 200 the lines.
function app.contract()
  local key, out = ngx.var.arg_key, {}
  local function note(...)
    local t = {}
    for i = 1, select("#", ...) do t[i] = tostring((select(i, ...))) end
    out[#out + 1] = table.concat(t, " ")
  end
  local lock = assert(resty_lock:new("locks", { timeout = 0, exptime = 5 }))
  note(lock:lock(key))
  note(lock:lock(key .. ":other"))
  note(lock:expire(7))
  local ttl = lock.held:ttl()
  note(ttl > 6 and ttl <= 7)
  note(lock:expire())
  ttl = lock.held:ttl()
  note(ttl > 4 and ttl <= 5)
  note(lock:unlock())
  note(lock:unlock())
  note(lock:expire())
  note(lock:lock(nil))
  note(lock:lock(""))
  return reply(200, table.concat(out, "\n"))
end

--- GET /keep?key=k&exptime=s: takes the lock on k and ends the request
-- without unlocking -> 200 "<fence>".
function app.keep()
  local lock = assert(resty_lock:new("locks", { exptime = arg_number("exptime") }))
  local elapsed, err = lock:lock(ngx.var.arg_key)
  if not elapsed then return reply(503, err) end
  return reply(200, string.format("%.0f", lock.held.fence))
end

local dead
--- GET /dead?timeout=s: a lock whose opts.client is a redislock client of
-- $dead_url (nothing listens there) -> 503 "<seconds taken> <error>".
function app.dead()
  dead = dead or redislock.new{ url = ngx.var.dead_url }
  local lock = assert(resty_lock:new("locks", { timeout = arg_number("timeout"), client = dead }))
  local began = core.now()
  local elapsed, err = lock:lock("dead")
  if elapsed then return reply(200, "taken") end
  return reply(503, string.format("%.3f %s", core.now() - began, err))
end

--- GET /cached?key=k&dict=d&hold=s&ttl=s: key's value from
-- spec/support/resty_cache.lua (the locks dictionary d), whose callback
-- counts who is inside at once ("cb_inside:<k>", "cb_overlaps:<k>"),
-- appends "<instance> <enter> <leave>" to "cb_spans:<k>" and holds for hold
-- seconds -> 200 the value | 500 the error.
function app.cached()
  local value, err = resty_cache.get("cache", ngx.var.arg_dict, ngx.var.arg_key, arg_number("ttl", 1), function(key)
    local enter = core.now()
    if cmd("INCR", "cb_inside:" .. key) > 1 then cmd("INCR", "cb_overlaps:" .. key) end
    ngx.sleep(arg_number("hold", 0.05))
    cmd("DECR", "cb_inside:" .. key)
    cmd("RPUSH", "cb_spans:" .. key, string.format("%s %.6f %.6f", ngx.var.instance, enter, core.now()))
    return "v" .. ngx.var.instance
  end)
  if value == nil then return reply(500, tostring(err)) end
  return reply(200, value)
end

return app
