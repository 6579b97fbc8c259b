-- SPDX-License-Identifier: MIT
--- redislock.args: checking what callers pass, and saying what they passed.
--
-- Argument errors raise at the caller's line ("bad argument #2 to 'acquire'
-- (ttl must be > 0)"), however deep inside redislock the check sits: every
-- module of redislock registers its source with `own`, and errors skip those
-- frames. Strings shown in messages are quoted, escaped and cut (`quote`).
-- Also the options of acquire and with_lock (`lock_opts`), shared by every
-- primitive that takes and holds a lease.

local core = require("redislock.core")

local error, getmetatable, pairs, select, tostring, type =
      error, getmetatable, pairs, select, tostring, type
local string_format = string.format
local math_floor = math.floor
local debug_getinfo = debug.getinfo
local to_ms, key_problem = core.ms, core.key_problem

local _M = { _VERSION = core._VERSION }

-- Sources (debug.getinfo's `source`) of redislock's own Lua code.
local OWN = {}

--- Registers a source (debug.getinfo(1, "S").source of a module, or a chunk
-- name) as redislock's own: errors skip its frames, and with_lock's abort
-- waits while it runs.
function _M.own(source)
  OWN[source] = true
end

--- Whether source is redislock's own code.
function _M.is_own(source)
  return OWN[source] == true
end

_M.own(debug_getinfo(1, "S").source)

--- { n = select("#", ...), ... }
function _M.pack(...)
  return { n = select("#", ...), ... }
end

--- Raises msg with the position of the first caller outside redislock, so
-- that argument errors point at the user's line however deep the check sits.
function _M.raise_at_caller(msg)
  local level = 2
  while true do
    local info = debug_getinfo(level, "S")
    if not info or not OWN[info.source] then break end
    level = level + 1
  end
  error(msg, level)
end
local raise_at_caller = _M.raise_at_caller

--- Raises "bad argument #n to 'fname' (msg)".
function _M.argerror(n, fname, msg)
  raise_at_caller(string_format("bad argument #%d to '%s' (%s)", n, fname, msg))
end
local argerror = _M.argerror

-- Keys (and other user strings) in messages are cut to this many bytes.
local MAX_SHOWN = 64

local ESCAPES = { ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t", ['"'] = '\\"', ["\\"] = "\\\\" }
local function escape(c)
  return ESCAPES[c] or string_format("\\x%02x", c:byte())
end

-- Whether s is UTF-8 text (for messages only: overlong forms pass).
local function is_utf8(s)
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    local len = c < 0x80 and 1 or (c >= 0xC2 and c <= 0xDF) and 2 or (c >= 0xE0 and c <= 0xEF) and 3
                or (c >= 0xF0 and c <= 0xF4) and 4 or nil
    if not len then return false end
    for j = i + 1, i + len - 1 do
      local b = s:byte(j)
      if not b or b < 0x80 or b > 0xBF then return false end
    end
    i = i + len
  end
  return true
end

-- A string as it appears in messages: quoted, control bytes escaped (and
-- every byte over 127 when it is not UTF-8 text), cut to about MAX_SHOWN
-- bytes (on a character's edge) with its full length after it.
local function quote(s)
  local shown = s
  if #s > MAX_SHOWN then
    local cut = MAX_SHOWN
    while cut > 1 and (s:byte(cut + 1) or 0) >= 0x80 and s:byte(cut + 1) <= 0xBF do cut = cut - 1 end
    shown = s:sub(1, cut)
  end
  local bytes = is_utf8(shown) and "[%c\"\\]" or "[%c\"\\\128-\255]"
  shown = '"' .. shown:gsub(bytes, escape) .. '"'
  if #s > MAX_SHOWN then shown = string_format("%s... (%d bytes)", shown, #s) end
  return shown
end

-- A value as it appears in messages: strings quoted, whole numbers without
-- a fraction (Lua 5.4 would write 2^31 as 2147483648.0), anything else as
-- tostring.
local function show(v)
  if type(v) == "string" then return quote(v) end
  if type(v) == "number" and v == math_floor(v) and v > -2 ^ 63 and v < 2 ^ 63 then
    return string_format("%.0f", v)
  end
  return tostring(v)
end
_M.quote, _M.show = quote, show

--- A number as text for a server (Redis, SQL), not for messages: whole
-- ones without a fraction, others with every digit a double has.
function _M.number_text(v)
  if v == math_floor(v) and v > -2 ^ 63 and v < 2 ^ 63 then return string_format("%.0f", v) end
  return string_format("%.17g", v)
end

local function check_key(n, fname, key)
  if type(key) ~= "string" then
    argerror(n, fname, "key must be a string, got " .. type(key))
  end
  local why = key_problem(key)
  if why then argerror(n, fname, why) end
end

-- Seconds (a Lua number) to integer milliseconds, or raise naming `what`.
local function check_seconds(n, fname, what, value)
  if type(value) ~= "number" then
    argerror(n, fname, string_format("%s must be a number, got %s", what, type(value)))
  end
  local ms, why = to_ms(value)
  if not ms then argerror(n, fname, what .. " " .. why) end
  return ms
end

local function check_self(self, mt, fname, what)
  if getmetatable(self) ~= mt then
    raise_at_caller(string_format("bad self to '%s' (%s expected, got %s; call it with ':', as x:%s(...))",
                                  fname, what, type(self), fname))
  end
end

-- Refuses arguments past the last one fname takes (luaposix's checknargs).
local function check_nargs(fname, max, ...)
  local extra = select("#", ...)
  if extra > 0 then
    argerror(max + 1, fname, string_format("no more than %d argument%s expected, got %d",
                                           max, max == 1 and "" or "s", max + extra))
  end
end
_M.check_key, _M.check_seconds, _M.check_self, _M.check_nargs = check_key, check_seconds, check_self, check_nargs

--- Refuses I/O in an nginx phase where cosockets are not available (blocking
-- there would stall the worker): t is the transport. A misuse found by the
-- first test of the code, not a condition to handle at run time, so it raises
-- like a bad argument rather than return nil, err.
function _M.check_phase(t, fname)
  local phase = t.io_problem and t:io_problem()
  if phase then
    raise_at_caller(string_format("redislock: '%s' cannot run in nginx's %s phase: cosockets are not"
      .. " available there; call it from rewrite, access, content or a timer (ngx.timer.at)", fname, phase))
  end
end

-- Refuses anything but nil or a table whose keys are all in `known`.
local function check_opts(n, fname, opts, known)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    argerror(n, fname, "options must be a table, got " .. type(opts))
  end
  for k in pairs(opts) do
    if not known[k] then
      argerror(n, fname, "unknown option " .. show(k))
    end
  end
  return opts
end

local function is_whole(v, lo, hi)
  return type(v) == "number" and v == math_floor(v) and v >= lo and v <= hi
end

-- Raises (argument n of fname) unless v is a whole number in lo..hi; what
-- names it ("option 'db'", "limit" ...).
local function check_whole(n, fname, what, v, lo, hi)
  if not is_whole(v, lo, hi) then
    argerror(n, fname, string_format("%s must be a whole number in %s..%s, got %s", what, show(lo), show(hi), show(v)))
  end
end

local function is_callable(f)
  local mt = getmetatable(f)
  return type(f) == "function" or (type(mt) == "table" and mt.__call ~= nil)
end

local ACQUIRE_OPTS = {
  wait = true, wait_mode = true, fair = true, renew = true, max_hold = true, on_lost = true,
  replicas = true, replica_timeout = true, handoff = true, lock_delay = true,
}
local WAIT_MODES = { notify = true, poll = true }

-- The options of acquire and with_lock, checked (scoped: for with_lock or
-- another with_ form); returns how to take and hold the lock: { wait =
-- seconds, mode = "notify" | "poll", fair = boolean, renew = boolean
-- (default: scoped), scoped, max_hold_ms, on_lost, replicas, replica_ms,
-- handoff = boolean (a release may hand the lock to this waiter; default
-- true), delay_ms (the lock delay, ms; nil: none) }.
local DEFAULT_HOW = {
  [false] = { wait = 0, mode = "notify", fair = false, renew = false, scoped = false, handoff = true },
  [true] = { wait = 0, mode = "notify", fair = false, renew = true, scoped = true, handoff = true },
}

-- The longest lock delay (seconds): a day.
local MAX_DELAY = 86400

local function check_acquire_opts(n, fname, opts, scoped)
  if opts == nil then return DEFAULT_HOW[scoped] end -- shared, never changed
  if type(opts) ~= "table" then
    argerror(n, fname, "options must be a table, got " .. type(opts))
  end
  for k in pairs(opts) do
    if not ACQUIRE_OPTS[k] then argerror(n, fname, "unknown option " .. show(k)) end
  end
  -- Every field at once: a table built whole is allocated once.
  local on_lost, max_hold, replicas, renew = opts.on_lost, opts.max_hold, opts.replicas, opts.renew
  if renew == nil then renew = scoped end -- the scoped forms renew by default
  local how = { wait = opts.wait or 0, mode = opts.wait_mode or "notify", fair = opts.fair or false,
                renew = renew, scoped = scoped, on_lost = on_lost, max_hold_ms = false, replicas = false,
                replica_ms = false, handoff = opts.handoff }
  if type(renew) ~= "boolean" then
    argerror(n, fname, "option 'renew' must be a boolean, got " .. type(renew))
  end
  if max_hold ~= nil then
    how.max_hold_ms = check_seconds(n, fname, "option 'max_hold'", max_hold)
  end
  if on_lost ~= nil and not is_callable(on_lost) then
    argerror(n, fname, "option 'on_lost' must be a function, got " .. type(on_lost))
  end
  if not renew and (max_hold ~= nil or on_lost ~= nil) then
    argerror(n, fname, string_format("option '%s' needs renewal (renew = true)",
                                     max_hold ~= nil and "max_hold" or "on_lost"))
  end
  if replicas ~= nil then
    check_whole(n, fname, "option 'replicas'", replicas, 1, 1000000)
    how.replicas = replicas
    how.replica_ms = opts.replica_timeout == nil and 1000
      or check_seconds(n, fname, "option 'replica_timeout'", opts.replica_timeout)
  elseif opts.replica_timeout ~= nil then
    argerror(n, fname, "option 'replica_timeout' needs 'replicas'")
  end
  -- false, not nil, kept the slots above: the readers take false for "none".
  if not how.max_hold_ms then how.max_hold_ms = nil end
  if not how.replicas then how.replicas, how.replica_ms = nil, nil end
  local wait = how.wait
  if type(wait) ~= "number" or wait ~= wait or wait < 0 or wait * 1000 > core.MAX_MS then
    argerror(n, fname, string_format("option 'wait' must be a number of seconds in 0..%.3f (2^53 ms)",
                                     core.MAX_MS / 1000))
  end
  if not WAIT_MODES[how.mode] then
    argerror(n, fname, "option 'wait_mode' must be \"notify\" or \"poll\", got " .. show(how.mode))
  end
  if type(how.fair) ~= "boolean" then
    argerror(n, fname, "option 'fair' must be a boolean, got " .. type(how.fair))
  end
  local lock_delay = opts.lock_delay
  if lock_delay ~= nil then
    if type(lock_delay) ~= "number" or lock_delay ~= lock_delay or lock_delay < 0 or lock_delay > MAX_DELAY then
      argerror(n, fname, string_format("option 'lock_delay' must be a number of seconds in 0..%d, got %s",
                                       MAX_DELAY, show(lock_delay)))
    end
    local ms = math_floor(lock_delay * 1000 + 0.5)
    if ms > 0 then how.delay_ms = ms end
  end
  if how.handoff == nil then
    how.handoff = true
  elseif type(how.handoff) ~= "boolean" then
    argerror(n, fname, "option 'handoff' must be a boolean, got " .. type(how.handoff))
  elseif not how.handoff and how.fair then
    argerror(n, fname, "option 'handoff' cannot be false with 'fair' (a fair lock goes to its first waiter)")
  end
  return how
end
_M.check_opts, _M.is_whole, _M.check_whole, _M.is_callable = check_opts, is_whole, check_whole, is_callable

--- The connection options that reach the C core as C strings (no NUL bytes).
local CSTRING_OPTS = { "host", "path", "username", "password" }

--- Checks the fields f of one server (host, port, path, username,
-- password, db, from options or a URL) for new; name(field) is how a
-- message names a field ("option 'port'", "option 'redlock' item 2: port").
-- Every server a client talks to is checked here: the client's own, and
-- each of Redlock's.
function _M.check_server(f, name)
  if f.port ~= nil then check_whole(1, "new", name("port"), f.port, 1, 65535) end
  if f.db ~= nil then check_whole(1, "new", name("db"), f.db, 0, 1000000) end
  if f.username and not f.password then argerror(1, "new", name("username") .. " needs a 'password'") end
  if f.host == "" or f.path == "" then
    argerror(1, "new", name(f.host == "" and "host" or "path") .. " must not be empty")
  end
  for _, field in ipairs(CSTRING_OPTS) do
    if type(f[field]) == "string" and f[field]:find("\0", 1, true) then
      argerror(1, "new", name(field) .. " must not contain NUL bytes")
    end
  end
end

--- The options of acquire and with_lock (n: their argument number; scoped:
-- for a with_ form, which renews by default), checked: returns how to take
-- and hold the lock.
_M.lock_opts = check_acquire_opts
-- The options' names, which spec/40 holds the API reference against (as in
-- client, tls, observe and ngx_every).
_M.OPTIONS = ACQUIRE_OPTS

-- The acquire options a topology or a primitive may refuse.
local REFUSABLE = { "fair", "replicas", "delay_ms" }
-- How a message names an option that how holds under another name.
local OPTION_NAME = { delay_ms = "lock_delay" }

--- Raises a bad argument n to fname for an acquire option set in how that
-- no (option name -> why not, or nil) refuses: "option 'fair' is not
-- available <where> (<why>)".
function _M.refuse(n, fname, how, no, where)
  if not no then return end
  for _, name in ipairs(REFUSABLE) do
    if how[name] and no[name] then
      argerror(n, fname, string_format("option '%s' is not available %s (%s)", OPTION_NAME[name] or name, where,
                                       no[name]))
    end
  end
end

--- Raises unless fn can be called.
function _M.check_fn(n, fname, fn)
  if not is_callable(fn) then
    argerror(n, fname, "function expected, got " .. type(fn))
  end
end

return _M
