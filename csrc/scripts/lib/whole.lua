-- SPDX-License-Identifier: MIT
-- whole(n): a whole number as Redis wants it (Lua 5.1 would write 1e+15).
local function whole(n)
  return string.format('%.0f', n)
end
