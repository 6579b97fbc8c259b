-- SPDX-License-Identifier: MIT

--- redislock.metrics: the figures of a client's holds for Prometheus,
-- built on the client's observer (redislock.new's `metrics` or `observer`
-- option): per kind of hold and per group of lock names, histograms of the
-- wait before an acquisition and of the time held; counters of
-- acquisitions, busy answers, releases, losses, failed renewals, handoffs,
-- errors (`connection`, `redis`) and holds held too long; gauges of the
-- holds held and the callers waiting now. Rendered in Prometheus' text
-- format (version 0.0.4); written to a file (node_exporter's textfile
-- collector) or, under OpenResty, served from a location, with the figures
-- of every worker added up in a shared dict (`lua_shared_dict`).
--
--     local metrics = require("redislock.metrics").new{ group = function(name) return name:match("^%a+") end }
--     local client = redislock.new{ url = ..., metrics = metrics }
--     print(metrics:render())
--
-- Names are unbounded, so figures are kept per group of names, never per
-- name: by default a name's part before its first ':' ("orders:42" is in
-- "orders"), and at most `max_groups` groups (then "other"). Where they are
-- counted is redislock/metrics_count.lua's, the text
-- redislock/metrics_text.lua's.

local args = require("redislock.args")
local core = require("redislock.core")
local count = require("redislock.metrics_count")
local text = require("redislock.metrics_text").text

local error, getmetatable, ipairs, pcall, rawget, setmetatable, type =
      error, getmetatable, ipairs, pcall, rawget, setmetatable, type
local string_format, math_huge = string.format, math.huge
local io_open, os_remove, os_rename = io.open, os.remove, os.rename
local argerror, check_opts, check_whole, is_callable, check_nargs =
      args.argerror, args.check_opts, args.check_whole, args.is_callable, args.check_nargs

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

local Metrics = {}
local metrics_mt = { __index = Metrics }

-- The HTTP Content-Type of the text render gives.
local CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

-- Default buckets (seconds, upper bounds): waits from a round trip to
-- half a minute; holds from a quick section to an hour's job.
local WAIT_BUCKETS = { 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30 }
local HOLD_BUCKETS = { 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600 }

-- Groups kept at most, by default; a name of a group beyond them is "other".
local MAX_GROUPS = 100

--- The options of redislock.metrics.new.
-- @table metrics_options
-- @field group function(name, kind) -> a group's name for a lock name;
--   or false: one group, "all" (default: the name's part before its first
--   ':', the whole name when it has none)
-- @field max_groups the most groups kept (default 100); names of any
--   further group count in "other"
-- @field wait_buckets the wait histogram's upper bounds, seconds, in
--   increasing order (default 0.001 to 30)
-- @field hold_buckets the hold histogram's upper bounds, seconds, in
--   increasing order (default 0.01 to 3600)
-- @field held_too_long seconds: a hold that ends (released or found lost)
--   after more than this counts in redislock_held_too_long_total
-- @field on_held_too_long function(info), called then (info: the event's,
--   key, kind, held); its errors are dropped
-- @field dict OpenResty: the name of a `lua_shared_dict` where every
--   worker adds its figures (default: each worker keeps its own)
local OPTS = { group = true, max_groups = true, wait_buckets = true, hold_buckets = true, held_too_long = true,
               on_held_too_long = true, dict = true }

-- A list of bucket bounds (option name), checked: positive, finite,
-- increasing; a copy. The options are argument narg to fname.
local function check_buckets(narg, fname, name, list)
  if type(list) ~= "table" or #list == 0 then
    argerror(narg, fname, string_format("option '%s' must be a non-empty list of seconds", name))
  end
  local copy, last = {}, 0
  for i, b in ipairs(list) do
    if type(b) ~= "number" or b ~= b or b <= last or b == math_huge then
      argerror(narg, fname, string_format("option '%s' must list finite seconds > 0 in increasing order (item %d: %s)",
                                          name, i, args.show(b)))
    end
    copy[i], last = b, b
  end
  return copy
end

-- The default group of a name: its part before the first ':'.
local function by_prefix(name)
  return name:match("^([^:]*):") or name
end

local function one_group()
  return "all"
end

-- The shared dict called name (argument narg to fname, what: how the
-- message names it), checked.
local function shared_dict(narg, fname, what, name)
  local ngx = rawget(_G, "ngx")
  if type(name) ~= "string" then
    argerror(narg, fname, what .. " must be a string, got " .. type(name))
  elseif not (ngx and ngx.shared) then
    argerror(narg, fname, what .. " needs OpenResty (ngx.shared)")
  elseif not ngx.shared[name] then
    argerror(narg, fname, string_format("%s: no lua_shared_dict %s in nginx.conf", what, args.quote(name)))
  end
  return ngx.shared[name]
end

-- new's work: the options are argument narg to fname (the function the
-- user called), for the messages.
local function make(narg, fname, opts)
  opts = check_opts(narg, fname, opts, OPTS)
  local group = opts.group
  if group == nil then
    group = by_prefix
  elseif group == false then
    group = one_group
  elseif not is_callable(group) then
    argerror(narg, fname, "option 'group' must be a function or false, got " .. type(group))
  end
  if opts.max_groups ~= nil then check_whole(narg, fname, "option 'max_groups'", opts.max_groups, 1, 100000) end
  local too_long = opts.held_too_long
  if too_long ~= nil and (type(too_long) ~= "number" or too_long ~= too_long or too_long <= 0) then
    argerror(narg, fname, "option 'held_too_long' must be a number of seconds > 0, got " .. args.show(too_long))
  end
  if opts.on_held_too_long ~= nil and not is_callable(opts.on_held_too_long) then
    argerror(narg, fname, "option 'on_held_too_long' must be a function, got " .. type(opts.on_held_too_long))
  end
  local dict = opts.dict ~= nil and shared_dict(narg, fname, "option 'dict'", opts.dict) or nil
  -- _records: kind -> group -> its figures; _by_name: kind -> name -> the
  -- same records (for _nnames names at most), _groups: the groups made.
  local self = {
    _group = group, _max_groups = opts.max_groups or MAX_GROUPS, _groups = {}, _ngroups = 0,
    _records = {}, _by_name = {}, _nnames = 0,
    _wait_buckets = opts.wait_buckets and check_buckets(narg, fname, "wait_buckets", opts.wait_buckets) or WAIT_BUCKETS,
    _hold_buckets = opts.hold_buckets and check_buckets(narg, fname, "hold_buckets", opts.hold_buckets) or HOLD_BUCKETS,
    _too_long = too_long, _on_too_long = opts.on_held_too_long, _dict = dict,
  }
  return setmetatable(self, metrics_mt)
end

--- Makes a set of figures (no I/O). Give it to redislock.new as the option
-- `metrics` (or its observer() as `observer`), to as many clients as you
-- like.
-- @tparam[opt] metrics_options opts how to group names, the buckets, the
--   "held too long" threshold, and the OpenResty shared dict
-- @treturn Metrics the figures
-- @raise "bad argument #1 to 'new' (...)" for an unknown or malformed option
function _M.new(opts, ...)
  check_nargs("new", 1, ...)
  return make(1, "new", opts)
end

--- Whether x is a Metrics (of redislock.metrics.new).
-- @param x anything
-- @treturn boolean
function _M.is_metrics(x)
  return getmetatable(x) == metrics_mt
end

-- The figures of each shared dict in this nginx worker (shared).
local in_dict = {}

--- OpenResty: the worker's figures that add up in the shared dict called
-- dict, made by the first call in the worker (with opts; later calls
-- return it as it is): `redislock.new{ metrics = metrics.shared("redislock_metrics") }`.
-- @string dict the `lua_shared_dict`'s name
-- @tparam[opt] metrics_options opts as new's (but dict), for the first call
-- @treturn Metrics the figures
-- @raise "bad argument #1 to 'shared' (...)" for a dict that is not
-- there, "bad argument #2 to 'shared' (...)" for a bad option
function _M.shared(dict, opts, ...)
  check_nargs("shared", 2, ...)
  if type(dict) ~= "string" then argerror(1, "shared", "dict name must be a string, got " .. type(dict)) end
  local m = in_dict[dict]
  if m then return m end
  if opts ~= nil and type(opts) ~= "table" then argerror(2, "shared", "options must be a table, got " .. type(opts)) end
  if opts and opts.dict ~= nil then argerror(2, "shared", "option 'dict' is the first argument") end
  m = make(2, "shared", opts)
  m._dict = shared_dict(1, "shared", "dict", dict)
  in_dict[dict] = m
  return m
end

--- OpenResty: answers the request with the figures in the shared dict
-- called dict (shared(dict):serve()), from a content handler:
-- `content_by_lua_block { require("redislock.metrics").serve("redislock_metrics") }`.
-- @string dict the `lua_shared_dict`'s name
-- @return nothing
function _M.serve(dict, ...)
  check_nargs("serve", 1, ...)
  return _M.shared(dict):serve()
end

--- The figures of the holds of the clients given it (redislock.new's
-- `metrics`), what redislock.metrics.new and shared make.
-- @type Metrics

--- An observer function(event, info) for redislock.new's `observer` that
-- counts into these figures (what the option `metrics` installs).
-- @tparam[opt] function chain another observer, called after it
-- @treturn function the observer
function Metrics:observer(chain, ...)
  args.check_self(self, metrics_mt, "observer", "redislock metrics")
  check_nargs("observer", 1, ...)
  if chain ~= nil and not is_callable(chain) then
    argerror(1, "observer", "function expected, got " .. type(chain))
  end
  local add = count.observer(self)
  if not chain then return add end
  return function(event, info)
    pcall(add, event, info)
    chain(event, info)
  end
end

--- The figures in Prometheus' text format (version 0.0.4): under
-- OpenResty with `dict`, those of every worker.
-- @treturn string the text, one figure a line, ending with a new line
function Metrics:render(...)
  args.check_self(self, metrics_mt, "render", "redislock metrics")
  check_nargs("render", 0, ...)
  return text(count.rows(self), { wait = self._wait_buckets, hold = self._hold_buckets })
end

--- Writes the figures to path, whole: to path .. ".tmp" first, then
-- renamed (for node_exporter's textfile collector, which reads *.prom).
-- @string path the file
-- @treturn boolean true
-- @return[2] nil
-- @treturn[2] string why not
function Metrics:write(path, ...)
  args.check_self(self, metrics_mt, "write", "redislock metrics")
  if type(path) ~= "string" or path == "" then argerror(1, "write", "path must be a non-empty string") end
  check_nargs("write", 1, ...)
  local tmp = path .. ".tmp"
  local f, err = io_open(tmp, "w")
  if not f then return nil, err end
  local ok, werr = f:write(self:render())
  local closed, cerr = f:close() -- a flush that fails here must not replace the good file
  if ok and not closed then ok, werr = nil, cerr end
  if ok then ok, werr = os_rename(tmp, path) end
  if not ok then
    os_remove(tmp)
    return nil, werr
  end
  return true
end

--- OpenResty: answers the request with the figures (Content-Type
-- `text/plain; version=0.0.4`), from a content handler:
-- `content_by_lua_block { require("app").metrics:serve() }`.
-- @return nothing
function Metrics:serve(...)
  args.check_self(self, metrics_mt, "serve", "redislock metrics")
  check_nargs("serve", 0, ...)
  local ngx = rawget(_G, "ngx")
  if not (ngx and ngx.print) then
    error("redislock: serve needs OpenResty; in plain Lua use render or write", 2)
  end
  ngx.header["Content-Type"] = CONTENT_TYPE
  ngx.print(self:render())
end

_M.OPTIONS = OPTS -- the options' names (spec/40 holds the reference against them)

return _M
