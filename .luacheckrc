-- luacheck configuration for `make lint`
std = "max"
max_line_length = 120
files["spec"] = { std = "+busted" }
files["spec/crc16.lua"] = { std = "max" }
