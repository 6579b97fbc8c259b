-- SPDX-License-Identifier: MIT

--- redislock.metrics_count: where redislock.metrics counts. A record per
-- kind of hold and group of lock names holds its figures (counters,
-- gauges, the histograms' buckets, errors by code), in this process or,
-- under OpenResty, in a shared dict where every worker adds its own; the
-- observer functions add each event to its record, and rows reads every
-- record back for redislock/metrics_text.lua.

local core = require("redislock.core")

local ipairs, pairs, pcall, type = ipairs, pairs, pcall, type

local _M = { _VERSION = core._VERSION }

-- Names whose group is remembered at most (then forgotten at once).
local MAX_NAMES = 4096

local SEP = "\1" -- between the parts of a figure's key: family, kind, group[, code or bucket]

-- A group's name in a shared dict's key, and back: SEP (and ESC, which
-- escapes) written as two bytes, so that a group may hold any byte.
local ESC = "\2"
local ESCAPED = { [SEP] = ESC .. "1", [ESC] = ESC .. "2" }
local UNESCAPED = { ["1"] = SEP, ["2"] = ESC }
local function escape(g) return (g:gsub("[\1\2]", ESCAPED)) end
local function unescape(g) return (g:gsub("\2([12])", UNESCAPED)) end

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
-- or code>]", the group escaped), each added with 0 so that every figure
-- shows from the start.
local function new_record(self, kind, g)
  local s = { kind = kind, group = g, wait = {}, hold = {}, errors = {} }
  for _, f in ipairs(FIELDS) do s[f] = 0 end
  for i = 1, #self._wait_buckets + 1 do s.wait[i] = 0 end
  for i = 1, #self._hold_buckets + 1 do s.hold[i] = 0 end
  for _, code in ipairs(CODES) do s.errors[code] = 0 end
  local dict = self._dict
  if dict then
    local tail = SEP .. kind .. SEP .. escape(g)
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

--- observer(metrics) -> function(event, info): what counts the client
-- observer's events into metrics (redislock.metrics' object: its options
-- as fields, _records, _by_name, _nnames, _groups, _ngroups, _dict).
function _M.observer(self)
  return self._dict and dict_observer(self) or local_observer(self)
end

--- rows(metrics) -> field -> rows { kind, group, code | bucket index | nil,
-- value }: every figure, for redislock/metrics_text.lua (with a shared
-- dict, every worker's).
function _M.rows(self)
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
      if field and type(value) == "number" then row(field, kind, unescape(g), extra ~= "" and extra or nil, value) end
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
  return rows
end

return _M
