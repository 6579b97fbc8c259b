-- luacheck configuration for `make lint`
std = "max"
max_line_length = 120
files["spec"] = { std = "+busted" }
files["spec/crc16.lua"] = { std = "max" }
-- Code that runs inside nginx, where ngx is a global.
files["lua/redislock/ngx.lua"] = { std = "max+ngx_lua" }
files["lua/redislock/ngx_conn.lua"] = { std = "max+ngx_lua" }
files["lua/redislock/ngx_lease.lua"] = { std = "max+ngx_lua" }
files["lua/redislock/ngx_watch.lua"] = { std = "max+ngx_lua" }
files["spec/support/ngx_app.lua"] = { std = "max+ngx_lua" }
files["examples/openresty"] = { std = "max+ngx_lua" }
files["torture/ngx_app.lua"] = { std = "max+ngx_lua" }
