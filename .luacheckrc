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
files["spec/support/ngx_resty_lock.lua"] = { std = "max+ngx_lua" }
files["spec/support/resty_cache.lua"] = { std = "max+ngx_lua" }
files["spec/support/ngx_metrics.lua"] = { std = "max+ngx_lua" }
files["examples/openresty"] = { std = "max+ngx_lua" }
files["torture/ngx_app.lua"] = { std = "max+ngx_lua" }
-- The Redis scripts as Redis gets them (tools/gen_scripts.lua --lint): Lua
-- 5.1 with Redis' globals, and no global written. A fragment included after
-- a script's first lines (read_release.lua, sem_release.lua) may name a
-- parameter as the script names a local before it (now): shadowing is no
-- mistake there.
files["build/scripts"] = {
  std = "lua51",
  ignore = { "43." },
  read_globals = { "redis", "KEYS", "ARGV", "cjson", "cmsgpack", "bit", "struct", "unpack" },
}
