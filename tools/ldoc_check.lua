-- SPDX-License-Identifier: MIT
-- An LDoc filter that checks the API reference is whole, and lists what it
-- documents for spec/40 to hold against the code:
--   LUA_PATH="tools/?.lua;;" ldoc --filter ldoc_check.check .
-- Every item LDoc shows (functions, tables, fields; not those marked
-- @local) must have a summary; a function must describe each of its
-- parameters and say what it returns (one @return or @treturn at least);
-- a table each of its fields. Prints a line per item and per field:
--   item <module> <name>
--   field <module> <table> <field>
-- then each problem as "problem <module> <name>: <what>", and ends with
-- "reference: ok (N items)" or "reference: N problems" (exit status 1).
local _M = {}

function _M.check(modules)
  local problems, items = {}, 0
  local function problem(mod, item, what)
    problems[#problems + 1] = string.format("problem %s %s: %s", mod.name, item.name, what)
  end
  for _, mod in ipairs(modules) do
    if (mod.summary or "") == "" then problem(mod, mod, "the module has no summary") end
    for _, item in ipairs(mod.items) do
      items = items + 1
      print(string.format("item %s %s", mod.name, item.name))
      if (item.summary or "") == "" then problem(mod, item, "no summary") end
      local params = item.params or {}
      for _, p in ipairs(params) do
        if item.type == "table" then print(string.format("field %s %s %s", mod.name, item.name, p)) end
        if p ~= "..." and (params.map[p] or ""):match("^%s*$") then
          problem(mod, item, string.format("%s '%s' is not described", item.type == "table" and "field"
                                           or "parameter", p))
        end
      end
      if item.type == "function" and not (item.ret and #item.ret > 0) then
        problem(mod, item, "no @return")
      end
    end
  end
  for _, p in ipairs(problems) do print(p) end
  if #problems > 0 then
    print(string.format("reference: %d problems", #problems))
    os.exit(1)
  end
  print(string.format("reference: ok (%d items)", items))
end

return _M
