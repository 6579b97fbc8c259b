-- SPDX-License-Identifier: MIT
-- The OpenResty side of make torture: GET /section runs one section
-- (torture/section.lua) in an nginx worker, over cosockets, and appends its
-- log lines to the log the driver names (torture/ngx_driver.lua).
-- Query: key, mode, hold, wait, ttl, id, seq (the driver's count of its
-- requests), log, lock (a port, or sentinel=...: section.client_opts),
-- reg_port, and tls=1 when the lock server speaks TLS only (checked against
-- nginx's lua_ssl_trusted_certificate, as localhost).
--
-- A request that hangs must say where it stood: each request keeps its
-- steps (with_lock called, fn entered and left, each log line's kind, the
-- handler done) with their times, and a timer of the worker writes the
-- steps of one still open well past what a section may take into nginx's
-- error log (warn), with its handler's traceback: where it waits, or (the
-- handler done, its stack empty) that a light thread keeps the request open. A request is
-- open until nginx finalizes it (done, in log_by_lua).
local redislock = require("redislock")
local core = require("redislock.core")
local section = require("torture.section")

local clients = {}

-- The worker's client for where, made once.
local function client(where, tls)
  if not clients[where] then clients[where] = redislock.new(section.client_opts(where, tls)) end
  return clients[where]
end

-- The requests of this worker not finalized yet: record -> true; a record
-- is { co (the handler's thread), what (id, seq, key), since, over (when
-- it is overdue), steps, told }.
local open = {}
local watching = false

-- How often the worker looks for overdue requests (seconds).
local LOOK = 1

local function step(rec, what)
  rec.steps[#rec.steps + 1] = string.format("%.3f %s", core.now(), what)
end

local function report(rec, t)
  ngx.log(ngx.WARN, string.format("torture: request %s open for %.1f s; steps: %s; %s", rec.what, t - rec.since,
                                  table.concat(rec.steps, ", "), debug.traceback(rec.co, "handler's stack:", 0)))
end

-- The timer: reports each request open past its time, once.
local function look(premature)
  if premature then return end
  local t = core.now()
  for rec in pairs(open) do
    if not rec.told and t > rec.over then
      rec.told = true
      report(rec, t)
    end
  end
end

local _M = {}

--- How long (seconds) a section given wait and ttl may take before it is
-- overdue: it waits, holds for at most 3 TTLs, and releases; faults may
-- stop its nginx worker a few seconds.
function _M.overdue(wait, ttl)
  return wait + 3 * ttl + 5
end

--- How often the worker looks for overdue requests (seconds).
_M.LOOK = LOOK

function _M.section()
  local a = ngx.req.get_uri_args()
  local ttl, wait = tonumber(a.ttl), tonumber(a.wait)
  local rec = { co = coroutine.running(), since = core.now(), steps = {},
                what = string.format("worker %s #%s on %s", a.id, tostring(a.seq), a.key) }
  rec.over = rec.since + _M.overdue(wait, ttl)
  open[rec] = true
  ngx.ctx.torture = rec
  if not watching then watching = ngx.timer.every(LOOK, look) end
  local function log(line)
    step(rec, line:sub(1, 1))
    local f = assert(io.open(a.log, "a"))
    f:write(line)
    f:close()
  end
  local c = client(a.lock, a.tls == "1")
  local function with_lock(cl, key, t, fn, opts)
    step(rec, "with_lock")
    return c.with_lock(cl, key, t, function(lock)
      step(rec, "fn")
      fn(lock)
      step(rec, "fn done")
    end, opts)
  end
  section.run({ key = a.key, mode = a.mode, hold = tonumber(a.hold), wait = wait }, a.id, ttl, with_lock, c,
              client(a.reg_port), ngx.sleep, log)
  step(rec, "handler done")
  ngx.say("ok")
end

--- log_by_lua: the request is finalized (its light threads ended too).
function _M.done()
  local rec = ngx.ctx.torture
  if not rec then return end
  open[rec] = nil
  if rec.told then
    ngx.log(ngx.WARN, string.format("torture: request %s finalized after %.1f s", rec.what, core.now() - rec.since))
  end
end

return _M
