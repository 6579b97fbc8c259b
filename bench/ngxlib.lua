-- SPDX-License-Identifier: MIT
-- What the benchmarks that run nginx share (not a test): a private nginx with
-- Debian's lua module from a temporary prefix, on a free loopback port,
-- stopped by its PID.
local socket = require("socket")
local B = require("benchlib")
local read_file = require("tools.read_file") -- bench/run.sh runs from the checkout's root

local M = {}

M.read_file = read_file

local function alive(pid)
  local stat = read_file("/proc/" .. pid .. "/stat")
  return stat ~= nil and not stat:match("^%d+ %b() Z")
end

local function q(s) return '"' .. s .. '"' end
M.quote = q

--- The nginx.conf text: Debian's lua module, everything nginx writes under
-- prefix, this checkout's Lua code, bench/ and LuaJIT build on the paths.
-- opts: workers (1), worker_connections (64), main (more main-context
-- lines), lua_path (more ?.lua patterns, before bench/'s), http (the lines
-- inside http { }: the servers), daemon (false: in the foreground, as under
-- valgrind).
function M.conf(prefix, opts)
  local root = B.root
  local lines = {
    "load_module /usr/lib/nginx/modules/ndk_http_module.so;",
    "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;",
    -- As root the workers would run as nobody, who may not enter the checkout.
    (B.run("id -u")):match("^0%s") and "user root;" or "",
    "worker_processes " .. (opts.workers or 1) .. ";",
    opts.daemon == false and "daemon off;" or "daemon on;",
    "pid " .. q(prefix .. "/nginx.pid") .. ";",
    "error_log " .. q(prefix .. "/logs/error.log") .. " warn;",
    opts.main or "",
    "events { worker_connections " .. (opts.worker_connections or 64) .. "; }",
    "http {",
    "  access_log off;",
  }
  for _, kind in ipairs({ "client_body", "proxy", "fastcgi", "uwsgi", "scgi" }) do
    lines[#lines + 1] = "  " .. kind .. "_temp_path " .. q(prefix .. "/temp/" .. kind) .. ";"
  end
  lines[#lines + 1] = "  lua_package_path " .. q(root .. "/lua/?.lua;" .. (opts.lua_path or "") .. root
                                                   .. "/bench/?.lua;;") .. ";"
  lines[#lines + 1] = "  lua_package_cpath " .. q(root .. "/build/luajit/?.so;;") .. ";"
  lines[#lines + 1] = opts.http
  lines[#lines + 1] = "}"
  return table.concat(lines, "\n") .. "\n"
end

--- A temporary prefix for nginx, with its conf/, logs/ and temp/ folders.
function M.prefix()
  local prefix = (B.run("mktemp -d")):gsub("%s+$", "")
  assert(prefix:match("^/"), "cannot make a temporary folder")
  assert(B.run("mkdir -p " .. B.sh_quote(prefix .. "/conf") .. " " .. B.sh_quote(prefix .. "/logs") .. " "
               .. B.sh_quote(prefix .. "/temp")))
  return prefix
end

--- Starts nginx: conf_of(prefix, port) gives its nginx.conf; env: more
-- variables for it ("NAME=value ..."). Returns its port, master PID and
-- prefix, or raises with its error log. Tries other ports when one is taken.
function M.start(conf_of, env)
  local prefix = M.prefix()
  for _ = 1, 5 do
    local port = B.free_port()
    local conf = prefix .. "/conf/nginx.conf"
    local f = assert(io.open(conf, "w"))
    f:write(conf_of(prefix, port))
    f:close()
    -- Output to a file: the daemon would hold a pipe open. LUA_PATH/LUA_CPATH
    -- would leak the Lua 5.4 build into the lua module's ";;".
    B.run("env -u LUA_PATH -u LUA_CPATH " .. (env or "") .. " nginx -p " .. B.sh_quote(prefix .. "/") .. " -c "
          .. B.sh_quote(conf) .. " > " .. B.sh_quote(prefix .. "/logs/nginx.out") .. " 2>&1")
    local deadline = B.now() + 5
    while B.now() < deadline do
      local pid = tonumber(read_file(prefix .. "/nginx.pid") or "")
      local c = socket.tcp()
      c:settimeout(0.2)
      local up = pid and alive(pid) and c:connect("127.0.0.1", port)
      c:close()
      if up then return port, pid, prefix end
      local log = (read_file(prefix .. "/logs/nginx.out") or "") .. (read_file(prefix .. "/logs/error.log") or "")
      if log:find("Address already in use", 1, true) then break end
      if pid == nil and log:find("emerg", 1, true) then error("nginx did not start:\n" .. log) end
      socket.sleep(0.02)
    end
  end
  error("nginx did not start:\n" .. (read_file(prefix .. "/logs/error.log") or ""))
end

--- Stops nginx by its PID: QUIT (graceful), then TERM; removes the prefix.
function M.stop(pid, prefix)
  for _, sig in ipairs({ "QUIT", "TERM" }) do
    if pid and alive(pid) then
      os.execute("kill -" .. sig .. " " .. pid .. " 2>/dev/null")
      local deadline = B.now() + 5
      while alive(pid) and B.now() < deadline do socket.sleep(0.02) end
    end
  end
  os.execute("rm -rf " .. B.sh_quote(prefix))
end

return M
