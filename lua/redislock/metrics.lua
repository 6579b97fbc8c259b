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
-- "orders"), and at most `max_groups` groups (then "other"). The text
-- itself is redislock/metrics_text.lua's.
--
-- (Over 400 lines: the API reference's comments are a third of it, and the
-- observer of a process's figures repeats the two events of every cycle in
-- place, to stay cheap.)

local args = require "redislock.args"
local core = require "redislock.core"
local text = require("redislock.metrics_text").text

local error, getmetatable, ipairs, pairs, pcall, rawget, setmetatable, type =
      error, getmetatable, ipairs, pairs, pcall, rawget, setmetatable, type
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
-- Names whose group is remembered at most (then forgotten at once).
local MAX_NAMES = 4096

local SEP = "\1" -- between the parts of a figure's key: family, kind, group[, code or bucket]

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
-- increasing; a copy.
local function check_buckets(name, list)
  if type(list) ~= "table" or #list == 0 then
    argerror(1, "new", string_format("option '%s' must be a non-empty list of seconds", name))
  end
  local copy, last = {}, 0
  for i, b in ipairs(list) do
    if type(b) ~= "number" or b ~= b or b <= last or b == math_huge then
      argerror(1, "new", string_format("option '%s' must list finite seconds > 0 in increasing order (item %d: %s)",
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

--- Makes a set of figures (no I/O). Give it to redislock.new as the option
-- `metrics` (or its observer() as `observer`), to as many clients as you
-- like.
-- @tparam[opt] metrics_options opts how to group names, the buckets, the
--   "held too long" threshold, and the OpenResty shared dict
-- @treturn Metrics the figures
-- @raise "bad argument #1 to 'new' (...)" for an unknown or malformed option
function _M.new(opts, ...)
  check_nargs("new", 1, ...)
  opts = check_opts(1, "new", opts, OPTS)
  local group = opts.group
  if group == nil then
    group = by_prefix
  elseif group == false then
    group = one_group
  elseif not is_callable(group) then
    argerror(1, "new", "option 'group' must be a function or false, got " .. type(group))
  end
  if opts.max_groups ~= nil then check_whole(1, "new", "option 'max_groups'", opts.max_groups, 1, 100000) end
  local too_long = opts.held_too_long
  if too_long ~= nil and (type(too_long) ~= "number" or too_long ~= too_long or too_long <= 0) then
    argerror(1, "new", "option 'held_too_long' must be a number of seconds > 0, got " .. args.show(too_long))
  end
  if opts.on_held_too_long ~= nil and not is_callable(opts.on_held_too_long) then
    argerror(1, "new", "option 'on_held_too_long' must be a function, got " .. type(opts.on_held_too_long))
  end
  local dict
  if opts.dict ~= nil then
    local ngx = rawget(_G, "ngx")
    if type(opts.dict) ~= "string" then
      argerror(1, "new", "option 'dict' must be a string, got " .. type(opts.dict))
    elseif not (ngx and ngx.shared) then
      argerror(1, "new", "option 'dict' needs OpenResty (ngx.shared)")
    elseif not ngx.shared[opts.dict] then
      argerror(1, "new", string_format("option 'dict': no lua_shared_dict %s in nginx.conf", args.quote(opts.dict)))
    end
    dict = ngx.shared[opts.dict]
  end
  -- _records: kind -> group -> its figures; _by_name: kind -> name -> the
  -- same records (for _nnames names at most), _groups: the groups made.
  local self = {
    _group = group, _max_groups = opts.max_groups or MAX_GROUPS, _groups = {}, _ngroups = 0,
    _records = {}, _by_name = {}, _nnames = 0,
    _wait_buckets = opts.wait_buckets and check_buckets("wait_buckets", opts.wait_buckets) or WAIT_BUCKETS,
    _hold_buckets = opts.hold_buckets and check_buckets("hold_buckets", opts.hold_buckets) or HOLD_BUCKETS,
    _too_long = too_long, _on_too_long = opts.on_held_too_long, _dict = dict,
  }
  return setmetatable(self, metrics_mt)
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
function _M.shared(dict, opts, ...)
  check_nargs("shared", 2, ...)
  if type(dict) ~= "string" then argerror(1, "shared", "dict name must be a string, got " .. type(dict)) end
  local m = in_dict[dict]
  if m then return m end
  if opts ~= nil and type(opts) ~= "table" then argerror(2, "shared", "options must be a table, got " .. type(opts)) end
  local o = { dict = dict }
  for k, v in pairs(opts or {}) do
    if k == "dict" then argerror(2, "shared", "option 'dict' is the first argument") end
    o[k] = v
  end
  m = _M.new(o)
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

-- The group of a name: the user's function's answer (a string; else
-- "other"); a group beyond max_groups is "other".
local function group_of(self, name, kind)
  local g = self._group(name, kind)
  if type(g) ~= "string" then g = "other" end
  if not self._groups[g] then
    if self._ngroups >= self._max_groups then return "other" end
    self._groups[g], self._ngroups = true, self._ngroups + 1
  end
  return g
end

-- A record's figures: counters and gauges (numbers), the histograms'
-- buckets (the last: +Inf), errors by code.
local FIELDS = { "acquired", "busy", "released", "lost", "renew_failed", "handoff", "held_too_long", "holds",
                 "waiting", "wait_sum", "hold_sum" }
local CODES = { "connection", "redis" }

-- The figures of one kind and group: their numbers (this process's), and
-- with a shared dict, k: their keys there ("<field>\1<kind>\1<group>[\1<i
-- or code>]"), each added with 0 so that every figure shows from the start.
local function new_record(self, kind, g)
  local s = { kind = kind, group = g, wait = {}, hold = {}, errors = {} }
  for _, f in ipairs(FIELDS) do s[f] = 0 end
  for i = 1, #self._wait_buckets + 1 do s.wait[i] = 0 end
  for i = 1, #self._hold_buckets + 1 do s.hold[i] = 0 end
  for _, code in ipairs(CODES) do s.errors[code] = 0 end
  local dict = self._dict
  if dict then
    local tail = SEP .. kind .. SEP .. g
    local k = { wait = {}, hold = {}, errors = {} }
    for _, f in ipairs(FIELDS) do k[f] = f .. tail end
    for i = 1, #s.wait do k.wait[i] = "wait" .. tail .. SEP .. i end
    for i = 1, #s.hold do k.hold[i] = "hold" .. tail .. SEP .. i end
    for _, code in ipairs(CODES) do k.errors[code] = "errors" .. tail .. SEP .. code end
    for _, f in ipairs(FIELDS) do dict:add(k[f], 0) end
    for _, list in pairs({ k.wait, k.hold, k.errors }) do
      for _, key in pairs(list) do dict:add(key, 0) end
    end
    s.k = k
  end
  return s
end

-- The record of the hold named name of kind, found by name next time (for
-- MAX_NAMES names; then they are forgotten at once).
local function record(self, kind, name)
  local g = group_of(self, name, kind)
  local groups = self._records[kind]
  if not groups then
    groups = {}
    self._records[kind] = groups
  end
  local s = groups[g]
  if not s then
    s = new_record(self, kind, g)
    groups[g] = s
  end
  if self._nnames >= MAX_NAMES then self._by_name, self._nnames = {}, 0 end
  local names = self._by_name[kind]
  if not names then
    names = {}
    self._by_name[kind] = names
  end
  names[name], self._nnames = s, self._nnames + 1
  return s
end

-- The bucket of v among bounds: the first bound v does not pass (#bounds
-- + 1: +Inf).
local function bucket(bounds, v)
  local i = 1
  while bounds[i] and v > bounds[i] do i = i + 1 end
  return i
end

-- add(self, s, field, n[, i]): adds n to a record's figure (s[field], or
-- s[field][i]): in this process, or in the shared dict (incr with 0 as
-- the initial value: atomic across workers; a full dict drops it).
local function local_add(_, s, field, n, i)
  if i then
    local t = s[field]
    t[i] = t[i] + n
  else
    s[field] = s[field] + n
  end
end

local function dict_add(self, s, field, n, i)
  local key = s.k[field]
  if i then key = key[i] end
  self._dict:incr(key, n, 0)
end

-- A hold ended (released or found lost) after held seconds: too long?
local function check_held(self, add, s, info, held)
  local limit = self._too_long
  if limit and held > limit then
    add(self, s, "held_too_long", 1)
    local fn = self._on_too_long
    if fn then pcall(fn, info) end
  end
end

-- What each observer event adds to its record s.
local ON = {
  acquired = function(self, add, s, info)
    local v = info.wait or 0
    add(self, s, "acquired", 1)
    add(self, s, "holds", 1)
    add(self, s, "wait", 1, bucket(self._wait_buckets, v))
    add(self, s, "wait_sum", v)
  end,
  busy = function(self, add, s) add(self, s, "busy", 1) end,
  released = function(self, add, s, info)
    add(self, s, "released", 1)
    local held = info.held
    if held then -- nil for a lock made by from_token: not counted when acquired
      add(self, s, "holds", -1)
      add(self, s, "hold", 1, bucket(self._hold_buckets, held))
      add(self, s, "hold_sum", held)
      check_held(self, add, s, info, held)
    end
  end,
  lost = function(self, add, s, info)
    add(self, s, "lost", 1)
    local held = info.held
    if held then
      add(self, s, "holds", -1)
      check_held(self, add, s, info, held)
    end
  end,
  renew_failed = function(self, add, s) add(self, s, "renew_failed", 1) end,
  handoff = function(self, add, s) add(self, s, "handoff", 1) end,
  waiting = function(self, add, s) add(self, s, "waiting", 1) end,
  waited = function(self, add, s) add(self, s, "waiting", -1) end,
  error = function(self, add, s, info)
    if s.errors[info.code] then add(self, s, "errors", 1, info.code) end
  end,
}

-- The observer of a process's figures. The two events of every cycle are
-- added in place (no call per figure): an uncontended cycle with metrics
-- on stays close to one with metrics off.
local function local_observer(self)
  local wait_bounds, hold_bounds = self._wait_buckets, self._hold_buckets
  return function(event, info)
    local kind = info.kind
    local names = self._by_name[kind]
    local s = names and names[info.key] or record(self, kind, info.key)
    if event == "acquired" then
      local v = info.wait or 0
      local i = 1
      while wait_bounds[i] and v > wait_bounds[i] do i = i + 1 end
      local w = s.wait
      w[i] = w[i] + 1
      s.acquired, s.holds, s.wait_sum = s.acquired + 1, s.holds + 1, s.wait_sum + v
    elseif event == "released" and info.held and not self._too_long then
      local v = info.held
      local i = 1
      while hold_bounds[i] and v > hold_bounds[i] do i = i + 1 end
      local h = s.hold
      h[i] = h[i] + 1
      s.released, s.holds, s.hold_sum = s.released + 1, s.holds - 1, s.hold_sum + v
    else
      local on = ON[event]
      if on then on(self, local_add, s, info) end
    end
  end
end

-- The observer that adds to a shared dict.
local function dict_observer(self)
  return function(event, info)
    local on = ON[event]
    if not on then return end
    local names = self._by_name[info.kind]
    on(self, dict_add, names and names[info.key] or record(self, info.kind, info.key), info)
  end
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
  local count = self._dict and dict_observer(self) or local_observer(self)
  if not chain then return count end
  return function(event, info)
    pcall(count, event, info)
    chain(event, info)
  end
end

--- The figures in Prometheus' text format (version 0.0.4): under
-- OpenResty with `dict`, those of every worker.
-- @treturn string the text, one figure a line, ending with a new line
function Metrics:render(...)
  args.check_self(self, metrics_mt, "render", "redislock metrics")
  check_nargs("render", 0, ...)
  -- field -> rows { kind, group, code | bucket index | nil, value }
  local rows = {}
  local function row(field, kind, g, extra, value)
    local list = rows[field]
    if not list then
      list = {}
      rows[field] = list
    end
    list[#list + 1] = { kind, g, extra, value }
  end
  local dict = self._dict
  if dict then
    for _, key in ipairs(dict:get_keys(0)) do
      local field, kind, g, extra = key:match("^([^\1]+)\1([^\1]*)\1([^\1]*)\1?([^\1]*)$")
      local value = dict:get(key)
      if field and type(value) == "number" then row(field, kind, g, extra ~= "" and extra or nil, value) end
    end
  else
    for kind, groups in pairs(self._records) do
      for g, s in pairs(groups) do
        for _, f in ipairs(FIELDS) do row(f, kind, g, nil, s[f]) end
        for _, f in ipairs({ "wait", "hold" }) do
          for i, n in ipairs(s[f]) do row(f, kind, g, i, n) end
        end
        for code, n in pairs(s.errors) do row("errors", kind, g, code, n) end
      end
    end
  end
  return text(rows, { wait = self._wait_buckets, hold = self._hold_buckets })
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
