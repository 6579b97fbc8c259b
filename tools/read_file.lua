-- SPDX-License-Identifier: MIT
-- A whole file's bytes, or nil when it cannot be opened: how the tools,
-- the specs' helpers and the benchmarks read a file. Each runs from the
-- checkout's root (or with it on package.path, as spec/run.sh puts it):
--   local read_file = require("tools.read_file")
return function(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end
