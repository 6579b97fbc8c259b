-- SPDX-License-Identifier: MIT
-- Writes csrc/rl_scripts.c, the scripts the core sends and its op table,
-- from csrc/scripts/*.lua (one file per script) and csrc/scripts/lib/*.lua
-- (the fragments they include). Run by `make scripts`; `make lint` runs it
-- with --check, which fails when the committed file is not current (the
-- rockspec's builtin build cannot run a generator, so the output is
-- committed).
--
--   lua5.4 tools/gen_scripts.lua [--check] [--lint DIR]
--
-- --lint DIR also writes each script as Redis gets it, its fragments in
-- place and its comments kept, into DIR/<name>.lua, for luacheck.
--
-- A script file's header lines (docs/development.md, "Scripts"):
--   --! op NAME keys=K1,K2,... [first=N] [flags=F1,F2,...]
--        an op of rl_proto.h's rl_op (RL_OP_<NAME>) that sends this script;
--        its keys by their names in rl_ops.h (lock: K_LOCK ...), in KEYS'
--        order (none: its caller names them); first: the core sends the
--        first N only, and all of them when the script answers
--        RL_ALL_KEYS (the release: its wake-up's names); flags: ms, n, once, stay,
--        args, each, named (rl_ops.h's RL_F_*), and noscript (the take,
--        which sends no script: it falls back on this one).
--        Several ops may share one script.
--   --! guard NAME       the wrapper of a user's script (guard.lua's eval):
--                        the line --! user marks where the user's text goes
--   --! include A B ...  the fragments lib/A.lua ... go here (each once a
--                        script; a fragment may include others)
-- RL_<NAME> in a script is replaced by rl_proto.h's #define of that number.
-- Lines that are only a comment, and blank lines, are not sent, nor the
-- indentation of the others.

local dir = "csrc/scripts"
local out_file = "csrc/rl_scripts.c"

local check, lint_dir = false, nil
do
  local i = 1
  while arg[i] do
    if arg[i] == "--check" then check = true
    elseif arg[i] == "--lint" and arg[i + 1] then lint_dir = arg[i + 1]; i = i + 1
    else io.stderr:write("usage: lua5.4 tools/gen_scripts.lua [--check] [--lint DIR]\n"); os.exit(2) end
    i = i + 1
  end
end

local function fail(fmt, ...)
  io.stderr:write("gen_scripts: ", string.format(fmt, ...), "\n")
  os.exit(1)
end

local function read(path)
  local f, err = io.open(path, "rb")
  if not f then fail("%s", err) end
  local s = f:read("a")
  f:close()
  return s
end

local function lines_of(text)
  local t = {}
  for line in (text:gsub("\n?$", "\n")):gmatch("(.-)\n") do t[#t + 1] = line end
  return t
end

local function listing(cmd)
  local p = assert(io.popen(cmd))
  local t = {}
  for line in p:lines() do t[#t + 1] = line end
  p:close()
  table.sort(t)
  return t
end

-- rl_proto.h: the numbers scripts may name, and the ops in enum order.
local proto = read("csrc/rl_proto.h")
local numbers = {}
for name, value in proto:gmatch("\n#define (RL_[%u%d_]+) +(%d+)") do numbers[name] = value end
local enum = proto:match("typedef enum {(.-)} rl_op;")
if not enum then fail("no rl_op enum in csrc/rl_proto.h") end
local op_order = {}
for name in enum:gsub("/%*.-%*/", ""):gmatch("RL_OP_([%u%d_]+)") do
  if name ~= "COUNT" then op_order[#op_order + 1] = name:lower() end
end

-- rl_ops.h: the key names (K_LOCK ...).
local key_names = {}
local keys_enum = read("csrc/rl_ops.h"):match("enum { (K_.-) };")
if not keys_enum then fail("no K_ enum in csrc/rl_ops.h") end
for name in keys_enum:gsub("/%*.-%*/", ""):gmatch("K_([%u%d]+)") do key_names[name:lower()] = true end

local flag_names = { ms = "RL_F_MS", n = "RL_F_N", once = "RL_F_ONCE", stay = "RL_F_STAY", args = "RL_F_ARGS",
                     each = "RL_F_EACH", named = "RL_F_NAMED" }

-- A file with its fragments resolved: its lines (comments kept), and what
-- its header says. included: the fragments already in this script.
local function resolve(path, included, into, meta)
  local n = 0
  for _, line in ipairs(lines_of(read(path))) do
    n = n + 1
    local word, rest = line:match("^%s*%-%-! *(%a+) *(.-) *$")
    if word == "include" then
      for name in rest:gmatch("[%w_]+") do
        if not included[name] then
          included[name] = true
          resolve(dir .. "/lib/" .. name .. ".lua", included, into, nil)
        end
      end
    elseif word and not meta then
      fail("%s:%d: a fragment has no header line '--! %s'", path, n, word)
    elseif word == "op" then
      local name, keys, flags = rest:match("^([%w_]+) +keys=([%w_,]*) *(.-)$")
      if not name then fail("%s:%d: '--! op NAME keys=...' expected", path, n) end
      local op = { name = name, keys = {}, flags = {}, first = 0 }
      local first, more = flags:match("^first=(%d+) *(.-)$")
      if first then op.first, flags = tonumber(first), more end
      for k in keys:gmatch("[^,]+") do
        if not key_names[k] then fail("%s:%d: no key named %s in rl_ops.h", path, n, k) end
        op.keys[#op.keys + 1] = "K_" .. k:upper()
      end
      local fl = flags:match("^flags=([%w,]+)$")
      if flags ~= "" and not fl then fail("%s:%d: 'flags=...' expected", path, n) end
      for f in (fl or ""):gmatch("[^,]+") do
        if f == "noscript" then op.noscript = true
        elseif flag_names[f] then op.flags[#op.flags + 1] = flag_names[f]
        else fail("%s:%d: no flag %s", path, n, f) end
      end
      if op.first > 0 and op.first >= #op.keys then fail("%s:%d: first=%d names every key", path, n, op.first) end
      meta.ops[#meta.ops + 1] = op
    elseif word == "guard" then
      if meta.kind then fail("%s:%d: one '--! guard' a file", path, n) end
      meta.kind, meta.name = word, rest
    elseif word == "user" then
      if meta.kind ~= "guard" then fail("%s:%d: '--! user' outside a guard", path, n) end
      into[#into + 1] = { user = true }
    elseif word then
      fail("%s:%d: unknown header line '--! %s'", path, n, word)
    else
      into[#into + 1] = { text = line, from = path, line = n }
    end
  end
end

-- What Redis gets of resolved lines: no comment lines, no blank ones, no
-- indentation, and RL_ names replaced by their numbers.
local function numbered(l)
  return (l.text:gsub("RL_[%u%d_]+", function(name)
    return numbers[name] or fail("%s:%d: %s is not a number in rl_proto.h", l.from, l.line, name)
  end))
end

local function sent(lines, path)
  local t = {}
  for _, l in ipairs(lines) do
    if l.user then
      t[#t + 1] = false
    elseif not l.text:match("^%s*%-%-") and l.text:match("%S") then
      if l.text:match("%-%-%[%[") then fail("%s:%d: no long comments in scripts", l.from, l.line) end
      t[#t + 1] = { text = (numbered(l):gsub("^%s+", "")), from = l.from }
    end
  end
  if #t == 0 then fail("%s: no code", path) end
  return t
end

-- A C string literal of items: lines of a script, and the names of the
-- macros of fragments ({ macro = NAME }), as many to a line of C as fit in
-- 120 columns (a script reads better in its .lua file than here); cont
-- ends each line of C but the last (a backslash in a macro).
local function c_literal(items, indent, cont)
  local t, cur, open = {}, nil, false -- the line of C so far; open: in a string
  local function fits(n) return cur and #indent + #cur + n + #cont <= 120 end
  local function flush()
    if cur then t[#t + 1] = indent .. cur .. (open and '"' or "") end
    cur, open = nil, false
  end
  for _, it in ipairs(items) do
    if type(it) == "table" then
      if fits((open and 2 or 1) + #it.macro) then
        cur, open = cur .. (open and '" ' or " ") .. it.macro, false
      else
        flush()
        cur = it.macro
      end
    else
      local piece = it:gsub('[\\"]', "\\%0") .. "\\n"
      if open and fits(#piece + 1) then
        cur = cur .. piece
      elseif not open and fits(#piece + 3) then
        cur, open = cur .. ' "' .. piece, true
      else
        flush()
        cur, open = '"' .. piece, true
      end
    end
  end
  flush()
  return table.concat(t, cont .. "\n")
end

local scripts, ops, guards = {}, {}, {}
for _, path in ipairs(listing("ls " .. dir .. "/*.lua")) do
  local base = path:match("([%w_]+)%.lua$")
  local meta, lines = { ops = {} }, {}
  resolve(path, {}, lines, meta)
  if meta.kind and #meta.ops > 0 then fail("%s: ops and a '--! %s' in one file", path, meta.kind) end
  if not meta.kind and #meta.ops == 0 then fail("%s: no '--! op' or '--! guard' line", path) end
  local code = sent(lines, path)
  local s = { base = base, path = path, lines = lines, code = code }
  scripts[#scripts + 1] = s
  for _, op in ipairs(meta.ops) do
    if ops[op.name] then fail("%s: op %s is also in %s", path, op.name, ops[op.name].script.path) end
    op.script = s
    ops[op.name] = op
  end
  if meta.kind == "guard" then guards[meta.name] = s end
end
for _, name in ipairs(op_order) do
  if not ops[name] then fail("op %s (rl_proto.h) is in no file of %s", name, dir) end
end
for name in pairs(ops) do
  local known = false
  for _, o in ipairs(op_order) do known = known or o == name end
  if not known then fail("op %s is not in rl_proto.h's rl_op", name) end
end
for _, name in ipairs({ "fenced", "owned" }) do
  if not guards[name] then fail("no '--! guard %s' in %s", name, dir) end
end

-- The fragments' texts, each once: a fragment that more than one script
-- includes is a macro, RL_LIB_<NAME>, which the scripts name where its
-- lines go (C joins adjacent string literals), so that the SHA1s are those
-- of the whole texts. runs(code) cuts a script's lines into runs of one
-- file each.
local function runs(code)
  local t = {}
  for _, l in ipairs(code) do
    local last = t[#t]
    if l and last and last.from == l.from then
      last.lines[#last.lines + 1] = l.text
    else
      t[#t + 1] = l and { from = l.from, lines = { l.text } } or false
    end
  end
  return t
end

local libs, lib_order = {}, {} -- by path: { text, users, macro }
for _, s in ipairs(scripts) do
  s.runs = runs(s.code)
  for _, r in ipairs(s.runs) do
    local base = r and r.from:match("^" .. dir .. "/lib/([%w_]+)%.lua$")
    if base then
      local text = table.concat(r.lines, "\n")
      local lib = libs[r.from]
      if not lib then
        lib = { text = text, lines = r.lines, users = 0, macro = "RL_LIB_" .. base:upper(), path = r.from }
        libs[r.from], lib_order[#lib_order + 1] = lib, lib
      elseif lib.text ~= text then
        fail("%s: its lines differ between scripts (its '--! include' lines come first)", r.from)
      end
      lib.users = lib.users + 1
    end
  end
end

-- The items of c_literal for runs first..last of a script.
local function items(s, first, last)
  local t = {}
  for i = first, last do
    local r, lib = s.runs[i], libs[s.runs[i].from]
    if lib and lib.users > 1 then
      t[#t + 1] = { macro = lib.macro }
    else
      table.move(r.lines, 1, #r.lines, #t + 1, t)
    end
  end
  return t
end

local out = {}
local function emit(s) out[#out + 1] = s end
emit("/* SPDX-License-Identifier: MIT */")
emit("/* Generated by tools/gen_scripts.lua from the files of csrc/scripts/: do")
emit("   not edit. Change a script there and run `make scripts`")
emit("   (docs/development.md). */")
emit('#include "rl_ops.h"')
emit("")
emit("/* C99 asks compilers to take string literals of 4095 bytes; GCC and")
emit("   Clang take any, and some scripts are longer. */")
emit('#pragma GCC diagnostic ignored "-Woverlength-strings"')
emit("")
emit("/* The fragments more than one script includes (csrc/scripts/lib/). */")
for _, lib in ipairs(lib_order) do
  if lib.users > 1 then
    emit("#define " .. lib.macro .. " \\")
    emit(c_literal(lib.lines, "  ", " \\"))
  end
end
emit("")
for _, s in ipairs(scripts) do
  if guards.fenced ~= s and guards.owned ~= s then
    emit("/* " .. s.path .. " */")
    emit("static const char s_" .. s.base .. "[] =")
    emit(c_literal(items(s, 1, #s.runs), "  ", "") .. ";")
    emit("")
  end
end
emit("const rl_op_row rl_ops[RL_OP_COUNT] = {")
for _, name in ipairs(op_order) do
  local op = ops[name]
  local keys = table.concat(op.keys, ", ") .. (#op.keys > 0 and ", " or "") .. "-1"
  local flags = #op.flags > 0 and table.concat(op.flags, " | ") or "0"
  emit(string.format('  [RL_OP_%s] = { "%s", %s, { %s }, %s%s },', name:upper(), name,
    op.noscript and "NULL" or "s_" .. op.script.base, keys, flags, op.first > 0 and ", " .. op.first or ""))
end
emit("};")
emit("")
for _, name in ipairs({ "fenced", "owned" }) do
  local s, at = guards[name], nil
  for i, r in ipairs(s.runs) do
    if r == false then
      if at then fail("%s: two '--! user' lines", s.path) end
      at = i
    end
  end
  if not at then fail("%s: no '--! user' line", s.path) end
  emit("/* " .. s.path .. " */")
  emit("const char rl_guard_" .. name .. "_head[] =")
  emit(c_literal(items(s, 1, at - 1), "  ", "") .. ";")
  -- The tail starts on a line of its own, whether the user's text ends
  -- with a newline or not.
  emit("const char rl_guard_" .. name .. "_tail[] =")
  emit('  "\\n"\n' .. c_literal(items(s, at + 1, #s.runs), "  ", "") .. ";")
end
local text = table.concat(out, "\n") .. "\n"

if lint_dir then
  for _, s in ipairs(scripts) do
    local t = {}
    for _, l in ipairs(s.lines) do
      t[#t + 1] = l.user and "local _, _ = KEYS, ARGV -- the user's script" or numbered(l)
    end
    local f = assert(io.open(lint_dir .. "/" .. s.base .. ".lua", "wb"))
    f:write(table.concat(t, "\n"), "\n")
    f:close()
  end
end

if check then
  local f = io.open(out_file, "rb")
  local current = f and f:read("a")
  if f then f:close() end
  if current ~= text then
    fail("%s is not what csrc/scripts/ makes: run `make scripts` and commit it", out_file)
  end
else
  local f = assert(io.open(out_file, "wb"))
  f:write(text)
  f:close()
end
