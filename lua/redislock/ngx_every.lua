-- SPDX-License-Identifier: MIT
--- redislock.ngx_every: election:every (redislock/election.lua), a recurring
-- job on exactly one nginx worker among every nginx that shares the Redis.
--
-- Called from init_worker_by_lua*, it starts one timer per worker. That
-- timer campaigns (waiting up to CAMPAIGN_STEP at a time, so that a worker
-- that exits notices); the worker that leads runs the job at once and then
-- every interval, passing it the term, for as long as it leads. Leadership
-- is a renewed lock with a TTL: a leader whose worker or machine goes away
-- stops renewing and the lead moves within the TTL (and a campaigner's
-- block, a second at most); a worker that exits (nginx -s quit, reload)
-- resigns, which hands the lead to a waiting campaigner at once. A job
-- that raises is logged, and runs again at its next time. The timer ends
-- when its worker exits or its client is closed.

local args = require("redislock.args")
local core = require("redislock.core")
local hold_mod = require("redislock.hold")
local io_mod = require("redislock.election_io")

local pcall, rawget, setmetatable, tostring, type = pcall, rawget, setmetatable, tostring, type
local string_format = string.format
local math_max, math_min = math.max, math.min
local check_seconds, check_nargs, quote, raise_at_caller = args.check_seconds, args.check_nargs, args.quote,
      args.raise_at_caller

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

-- How long one campaign waits (seconds) before the timer looks whether
-- its worker exits, and campaigns again; and the longest sleep between
-- such looks while leading.
local CAMPAIGN_STEP, LOOK = 1, 0.2

-- The leadership's TTL by default (seconds), and every's options.
local TTL, OPTS = 5, { ttl = true, value = true }

-- The elections each client runs a job for (client -> { name -> true }).
local jobs = setmetatable({}, { __mode = "k" })

local ngx -- OpenResty's, once every() found it

local function log(level, ...)
  ngx.log(level, "redislock every ", ...)
end

-- Whether the timer goes on: its worker does not exit, its client is open.
local function going(election)
  return not ngx.worker.exiting() and not hold_mod.closed(election._client)
end

-- Sleeps until `at` (ngx.now() seconds) in slices of LOOK, while the
-- timer goes on and lead (if given) is not lost.
local function sleep_until(election, at, lead)
  while going(election) and not (lead and lead:lost()) do
    ngx.update_time()
    local left = at - ngx.now()
    if left < 0.001 then return end -- nginx's timers count whole milliseconds
    ngx.sleep(math_min(left, LOOK))
  end
end

-- Leads, running fn every interval, until the lead is lost or the timer
-- ends (then resigns).
local function lead_loop(election, lead, interval, fn)
  log(ngx.INFO, "leads ", election.name, " (term ", tostring(lead.term), ")")
  local next_at = ngx.now()
  while going(election) and not lead:lost() do
    next_at = next_at + interval
    local ok, err = pcall(fn, lead.term, lead)
    if not ok then log(ngx.ERR, "job of ", election.name, " raised: ", tostring(err)) end
    ngx.update_time()
    next_at = math_max(next_at, ngx.now()) -- a job longer than its interval runs again at once
    sleep_until(election, next_at, lead)
  end
  local lost = lead:lost()
  if lost then
    log(ngx.WARN, election.name, ": ", lost)
  elseif not hold_mod.closed(election._client) then
    lead:resign()
  end
end

-- The timer's body: campaigns and leads until the timer ends.
local function run(election, interval, fn, ttl, value)
  while going(election) do
    local ok, lead, err = pcall(election.campaign, election, value, ttl, { wait = CAMPAIGN_STEP })
    if not ok then -- its renewal could not start (memory ...)
      lead, err = nil, tostring(lead)
    end
    if lead then
      ok, err = pcall(lead_loop, election, lead, interval, fn)
      if not ok then
        log(ngx.ERR, election.name, ": ", tostring(err))
        pcall(lead.resign, lead)
      end
    elseif core.error_class(err) ~= "busy" and going(election) then
      log(ngx.WARN, election.name, ": ", err)
      sleep_until(election, ngx.now() + CAMPAIGN_STEP)
    end
  end
  local mine = jobs[election._client]
  if mine then mine[election.name] = nil end
end

--- every(election, interval, fn[, opts]): election:every, arguments
-- unchecked. opts: ttl (seconds, default 5: how soon the job moves when
-- its worker or machine goes away), value (default "<host>/<worker
-- pid>"). Returns true, or nil and the timer's error.
function _M.every(election, interval, fn, opts, ...)
  ngx = rawget(_G, "ngx")
  if not (type(ngx) == "table" and ngx.timer and ngx.worker) then
    raise_at_caller("redislock: 'every' runs under OpenResty (nginx's timers); in plain Lua, loop on"
                    .. " with_leadership, or run the job under `redislock elect`")
  end
  check_seconds(1, "every", "interval", interval)
  args.check_fn(2, "every", fn)
  opts = args.check_opts(3, "every", opts, OPTS)
  check_nargs("every", 3, ...)
  local ttl = opts.ttl or TTL
  check_seconds(3, "every", "option 'ttl'", ttl)
  local value = opts.value or core.hostname() .. "/" .. ngx.worker.pid()
  io_mod.check_value(3, "every", value)
  local client = election._client
  hold_mod.check_not_closed(client, "every")
  local mine = jobs[client] or {}
  if mine[election.name] then
    raise_at_caller(string_format("bad self to 'every' (this client runs a job for election %s already)",
                                  quote(election.name)))
  end
  local ok, err = ngx.timer.at(0, function(premature)
    if not premature then run(election, interval, fn, ttl, value) end
  end)
  if not ok then return nil, err end
  mine[election.name], jobs[client] = true, mine
  return true
end

_M.OPTIONS = OPTS -- the options' names (spec/40 holds the reference against them)

return _M
