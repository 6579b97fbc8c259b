-- SPDX-License-Identifier: MIT

--- redislock.sql: the fence guard for a row of a SQL table (PostgreSQL's
-- dialect; the statements are plain SQL, any driver sends them). A row keeps
-- the highest fence that wrote it in a column of its own; a write carries
-- the hold's fence and is applied only when that is at least the row's:
--
--   local sql = require("redislock.sql")
--   local text, params = sql.update(lock, "reports", { body = report }, { id = 42 })
--   --> UPDATE "reports" SET "body" = $1, "fence" = $2 WHERE "id" = $3 AND "fence" <= $2
--   local text, params = sql.upsert(lock, "reports", { id = 42, body = report }, { "id" })
--   --> INSERT INTO "reports" ("body", "id", "fence") VALUES ($1, $2, $3) ON CONFLICT ("id")
--       DO UPDATE SET "body" = EXCLUDED."body", "fence" = EXCLUDED."fence"
--       WHERE "reports"."fence" <= EXCLUDED."fence"
--
-- A statement that changed no row was refused (a later holder wrote; for
-- update, or no such row). opts: fence (the column, "fence"), placeholder
-- ("$": $1, $2 ...; "?": one ? per value, params repeated to match).
-- sql.inline(text, params, escape) puts the values into the text, for a
-- driver without parameters (LuaSQL: escape = function(s) return
-- conn:escape(s) end).

local args = require("redislock.args")
local core = require("redislock.core")

local ipairs, pairs, tonumber, type = ipairs, pairs, tonumber, type
local string_format, table_concat, table_sort = string.format, table.concat, table.sort
local argerror, show, number_text = args.argerror, args.show, args.number_text

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

-- A quoted SQL identifier ("name", with " doubled), or a bad argument. No
-- $ in names: inline would take "$1" there for a parameter.
local function ident(n, fname, name)
  if type(name) ~= "string" or name == "" or name:find("\0", 1, true) or name:find("$", 1, true) then
    argerror(n, fname, "a column or table name must be a non-empty string without NUL or '$', got " .. show(name))
  end
  return '"' .. name:gsub('"', '""') .. '"'
end

-- The table's names, sorted (a stable statement), checked.
local function columns(n, fname, t, what)
  if type(t) ~= "table" then argerror(n, fname, what .. " must be a table, got " .. type(t)) end
  local names = {}
  for k in pairs(t) do
    if type(k) ~= "string" then argerror(n, fname, what .. " must map column names to values") end
    names[#names + 1] = k
  end
  if #names == 0 then argerror(n, fname, what .. " must name at least one column") end
  table_sort(names)
  return names
end

-- A value a statement may carry: a finite number, a string or a boolean
-- (what inline can write, and every driver takes); else a bad argument n
-- naming the column.
local function check_value(n, fname, what, column, v)
  local t = type(v)
  if (t == "number" and v == v and v ~= 1 / 0 and v ~= -1 / 0) or t == "string" or t == "boolean" then return v end
  argerror(n, fname, what .. " of column " .. show(column) .. " must be a finite number, a string or a boolean, got "
           .. (t == "number" and show(v) or "a " .. t))
end

-- Refuses a table of columns (argument n, what) that names the fence
-- column fcol (quoted): the hold's fence is written there.
local function check_no_fence(n, fname, what, names, fcol, opts)
  local plain = (type(opts) == "table" and opts.fence) or "fence"
  for _, c in ipairs(names) do
    if c == plain then
      argerror(n, fname, what .. " must not name the fence column " .. fcol .. ": the hold's fence goes there")
    end
  end
end

-- Collects params and writes placeholders: p(value[, name]) -> "$n" or "?";
-- a value given a name is one parameter however often it is used ("$").
local function params_of(style)
  local params, seen = {}, {}
  return params, function(value, name)
    if style == "$" and name and seen[name] then return seen[name] end
    params[#params + 1] = value
    local mark = style == "$" and "$" .. #params or "?"
    if name then seen[name] = mark end
    return mark
  end
end

-- What update and upsert (fname) start with: the fence of a hold (a
-- leadership's is its term), the fence column (quoted) and the table tbl
-- (argument 2, quoted), checked with the options (argument 5: fence
-- column, placeholder style); and the statement's params and their p (see
-- params_of).
local function setup(fname, hold, tbl, opts)
  local fence = type(hold) == "table" and (hold.fence or hold.term) or nil
  if type(fence) ~= "number" then
    argerror(1, fname, "a hold with a fence expected (a lock, a permit, a read or write lock, a leadership)")
  end
  opts = opts or {}
  if type(opts) ~= "table" then argerror(5, fname, "options must be a table, got " .. type(opts)) end
  local style = opts.placeholder or "$"
  if style ~= "$" and style ~= "?" then
    argerror(5, fname, "option 'placeholder' must be \"$\" or \"?\", got " .. show(style))
  end
  local fcol = ident(5, fname, opts.fence or "fence")
  local params, p = params_of(style)
  return fence, fcol, ident(2, fname, tbl), params, p
end

--- sql.update(hold, tbl, values, where[, opts]) -> text, params: UPDATE the
-- rows of tbl that match where (column -> value, all equal) and whose fence
-- is at most the hold's, setting values and the fence.
-- @tparam redislock.lock.Lock hold a hold with a fence (a lock, permit,
--   write hold; a leadership, whose term is its fence)
-- @string tbl the table's name
-- @tab values column -> value: what to set
-- @tab where column -> value: which rows (all equal)
-- @tparam[opt] table opts fence (the column's name, default "fence") and
--   placeholder ("$", the default: $1, $2 ...; or "?")
-- @treturn string the statement
-- @treturn table its parameters, in order
function _M.update(hold, tbl, values, where, opts)
  local fence, fcol, t, params, p = setup("update", hold, tbl, opts)
  local sets, conds = {}, {}
  local set_names, where_names = columns(3, "update", values, "values"), columns(4, "update", where, "where")
  check_no_fence(3, "update", "values", set_names, fcol, opts)
  check_no_fence(4, "update", "where", where_names, fcol, opts)
  for _, c in ipairs(set_names) do
    sets[#sets + 1] = ident(3, "update", c) .. " = " .. p(check_value(3, "update", "the value", c, values[c]))
  end
  sets[#sets + 1] = fcol .. " = " .. p(fence, "fence")
  for _, c in ipairs(where_names) do
    conds[#conds + 1] = ident(4, "update", c) .. " = " .. p(check_value(4, "update", "the value", c, where[c]))
  end
  conds[#conds + 1] = fcol .. " <= " .. p(fence, "fence")
  return string_format("UPDATE %s SET %s WHERE %s", t, table_concat(sets, ", "), table_concat(conds, " AND ")),
         params
end

--- sql.upsert(hold, tbl, row, keys[, opts]) -> text, params: INSERT row
-- (column -> value, the key columns included) with the hold's fence; when
-- a row with the same keys (a list of columns with a unique constraint)
-- exists, update it only if its fence is at most the hold's.
-- @tparam redislock.lock.Lock hold a hold with a fence
-- @string tbl the table's name
-- @tab row column -> value, the key columns included
-- @tparam {string,...} keys the key columns (a unique constraint)
-- @tparam[opt] table opts as update's
-- @treturn string the statement
-- @treturn table its parameters, in order
function _M.upsert(hold, tbl, row, keys, opts)
  local fence, fcol, t, params, p = setup("upsert", hold, tbl, opts)
  local names, marks, updates = {}, {}, {}
  if type(keys) ~= "table" or #keys == 0 then argerror(4, "upsert", "keys must be a list of column names") end
  local is_key, key_names = {}, {}
  for i, k in ipairs(keys) do
    key_names[i] = ident(4, "upsert", k)
    is_key[k] = true
    if row[k] == nil then argerror(4, "upsert", "the row has no value for key column " .. show(k)) end
  end
  local row_names = columns(3, "upsert", row, "row")
  check_no_fence(3, "upsert", "row", row_names, fcol, opts)
  for _, c in ipairs(row_names) do
    local q = ident(3, "upsert", c)
    names[#names + 1], marks[#marks + 1] = q, p(check_value(3, "upsert", "the value", c, row[c]))
    if not is_key[c] then updates[#updates + 1] = q .. " = EXCLUDED." .. q end
  end
  names[#names + 1], marks[#marks + 1] = fcol, p(fence)
  updates[#updates + 1] = fcol .. " = EXCLUDED." .. fcol
  return string_format("INSERT INTO %s (%s) VALUES (%s) ON CONFLICT (%s) DO UPDATE SET %s WHERE %s.%s <= EXCLUDED.%s",
                       t, table_concat(names, ", "), table_concat(marks, ", "), table_concat(key_names, ", "),
                       table_concat(updates, ", "), t, fcol, fcol), params
end

--- sql.inline(text, params, escape) -> text with each $n replaced by
-- params[n] as a SQL literal: numbers as they are, strings quoted with
-- escape(s) (the driver's: it knows the connection's encoding), booleans as
-- TRUE/FALSE. For "$" placeholders.
-- @string text a statement of update or upsert
-- @tab params its parameters
-- @func escape function(s): the driver's escaping of a string (without quotes)
-- @treturn string the statement with the values in it
function _M.inline(text, params, escape)
  if type(text) ~= "string" then argerror(1, "inline", "text must be a string, got " .. type(text)) end
  if type(params) ~= "table" then argerror(2, "inline", "params must be a list, got " .. type(params)) end
  if type(escape) ~= "function" then argerror(3, "inline", "escape must be a function, got " .. type(escape)) end
  if #params > 0 and not text:find("%$%d") then
    argerror(1, "inline", "text with $n placeholders expected (placeholder = \"$\")")
  end
  local literals = {}
  for i = 1, #params do
    local v = params[i]
    if type(v) == "number" and v == v and v ~= 1 / 0 and v ~= -1 / 0 then
      literals[i] = number_text(v)
    elseif type(v) == "boolean" then
      literals[i] = v and "TRUE" or "FALSE"
    elseif type(v) == "string" then
      local e = escape(v)
      if type(e) ~= "string" then
        argerror(3, "inline", "escape must return a string, got " .. show(e) .. " for parameter $" .. i)
      end
      literals[i] = "'" .. e .. "'"
    else
      argerror(2, "inline", "parameter $" .. i .. " must be a finite number, a string or a boolean, got " .. show(v))
    end
  end
  for i in text:gmatch("%$(%d+)") do
    if not literals[tonumber(i)] then
      argerror(2, "inline", "the text has $" .. i .. ", but params has " .. #params .. " value"
               .. (#params == 1 and "" or "s"))
    end
  end
  return (text:gsub("%$(%d+)", function(i) return literals[tonumber(i)] end))
end

return _M
