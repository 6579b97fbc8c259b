-- SPDX-License-Identifier: MIT
-- Redis Cluster's key slot (CRC16/XMODEM of the hash tag, mod 16384), so specs
-- can check that a lock, its holder's fence and the slot's fence record land on the same slot.
local crc16 = {}

-- Bit operations for both LuaJIT (bit library) and Lua 5.4 (operators, which
-- LuaJIT cannot parse, hence load).
local bxor, band, lshift
if jit then
  local bit = require("bit")
  bxor, band, lshift = bit.bxor, bit.band, bit.lshift
else
  bxor = load("return function(a, b) return a ~ b end")()
  band = load("return function(a, b) return a & b end")()
  lshift = load("return function(a, n) return a << n end")()
end

local function crc(s)
  local c = 0
  for i = 1, #s do
    c = bxor(c, lshift(s:byte(i), 8))
    for _ = 1, 8 do
      if band(c, 0x8000) ~= 0 then
        c = band(bxor(lshift(c, 1), 0x1021), 0xFFFF)
      else
        c = band(lshift(c, 1), 0xFFFF)
      end
    end
  end
  return c
end

function crc16.slot(key)
  local open = key:find("{", 1, true)
  if open then
    local close = key:find("}", open + 1, true)
    if close and close > open + 1 then key = key:sub(open + 1, close - 1) end
  end
  return crc(key) % 16384
end

return crc16
