-- SPDX-License-Identifier: MIT
-- Test helpers: private redis-servers on free loopback ports, started and stopped
-- by the specs (by PID), worker processes, and small utilities. No mocks: every
-- spec talks to a real redis-server.
local core = require "redislock.core"
local socket = require "socket"

local helpers = {}

-- Valgrind or sanitizers slow everything down: timing bounds are widened.
helpers.slow = os.getenv("REDISLOCK_SLOW") ~= nil and 10 or 1

local function sh_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
helpers.sh_quote = sh_quote

-- The command that runs the suite's interpreter (lua5.4 or luajit) for worker
-- processes; under `make asan` with the sanitizer runtime preloaded, which the
-- module it loads needs.
helpers.lua = os.getenv("REDISLOCK_LUA") or (jit and "luajit" or "lua5.4")
local preload = os.getenv("REDISLOCK_PRELOAD")
if preload and preload ~= "" then
  helpers.lua = "LD_PRELOAD=" .. sh_quote(preload) .. " " .. helpers.lua
end

-- Reads a popen'ed command's output; the exit status travels as a last line,
-- since LuaJIT's popen close does not report it.
local function finish(p)
  local out = p:read("*a")
  p:close()
  local code = tonumber(out:match("__EXIT:(%d+)\n?$"))
  out = out:gsub("__EXIT:%d+\n?$", "")
  return out, code == 0, code
end

-- Runs a shell command; returns its output, success and exit code. Under
-- `make asan` LD_PRELOAD names the sanitizer runtime, whose leak check would
-- fail tools that were not built for it (cp, luarocks ...): it is dropped here;
-- helpers.lua brings it back for Lua processes.
local function run(cmd)
  return finish(assert(io.popen("(unset LD_PRELOAD; " .. cmd .. ") 2>&1; echo __EXIT:$?")))
end
helpers.run = run

-- A new folder for one server: under $REDISLOCK_TEST_TMP when spec/run.sh set
-- it (it removes the lot at the end, even after a crash), else in $TMPDIR.
-- Server:stop removes it either way.
local tmp_root = os.getenv("REDISLOCK_TEST_TMP")
local function tmpdir()
  local template = tmp_root and sh_quote(tmp_root .. "/srv.XXXXXX") or "-t redislock-spec.XXXXXX"
  local dir = (run("mktemp -d " .. template):gsub("%s+$", ""))
  assert(dir:match("^/"), "cannot make a temporary folder: " .. dir)
  return dir
end

-- A port nobody listens on right now (the kernel picks it).
function helpers.free_port()
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return tonumber(port)
end

local function read_file(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end
helpers.read_file = read_file

-- os.execute says true (5.4) or 0 (LuaJIT) for success.
local function sh_ok(cmd)
  local r = os.execute(cmd)
  return r == true or r == 0
end
helpers.sh_ok = sh_ok

-- A zombie counts as gone: it has exited, and the PID 1 of some containers
-- reaps an adopted daemon only seconds later.
local function alive(pid)
  local stat = read_file("/proc/" .. pid .. "/stat")
  if stat and stat:match("^%d+ %b() Z") then return false end
  return sh_ok("kill -0 " .. pid .. " 2>/dev/null")
end

local Server = {}
Server.__index = Server

--- Starts a private redis-server; extra is a list of more arguments
-- (e.g. { "--requirepass", "s3cret" }); opts.max_port keeps the port at or below
-- it (a cluster node also needs port + 10000). Raises when it cannot start.
function helpers.start_redis(extra, opts)
  local max_port = opts and opts.max_port or 65535
  local last_log = ""
  for _ = 1, 5 do
    local port = helpers.free_port()
    while port > max_port do port = helpers.free_port() end
    local dir = tmpdir()
    local args = {
      "redis-server", "--bind", "127.0.0.1", "--port", port, "--save", "''", "--appendonly", "no",
      "--daemonize", "yes", "--pidfile", sh_quote(dir .. "/redis.pid"),
      "--logfile", sh_quote(dir .. "/redis.log"), "--dir", sh_quote(dir),
      "--unixsocket", sh_quote(dir .. "/redis.sock"), "--unixsocketperm", "700",
      "--enable-debug-command", "local",
    }
    for _, a in ipairs(extra or {}) do args[#args + 1] = sh_quote(a) end
    run(table.concat(args, " "))
    local deadline = core.now() + 5 * helpers.slow
    while core.now() < deadline do
      local log = read_file(dir .. "/redis.log") or ""
      local pid = tonumber(read_file(dir .. "/redis.pid") or "")
      if pid and log:find("Ready to accept connections", 1, true) then
        return setmetatable({ port = port, dir = dir, pid = pid, sock = dir .. "/redis.sock",
                              password = nil, url = "redis://127.0.0.1:" .. port }, Server)
      end
      if log:find("Address already in use", 1, true) then break end
      core.sleep(0.01)
    end
    last_log = read_file(dir .. "/redis.log") or "(no log)"
    local pid = tonumber(read_file(dir .. "/redis.pid") or "")
    if pid then os.execute("kill " .. pid .. " 2>/dev/null") end
  end
  error("cannot start redis-server; its log says:\n" .. last_log)
end

--- Stops the server (SIGTERM by PID, then waits for it to go) and removes its folder.
function Server:stop()
  if not self.pid then return end
  os.execute("kill " .. self.pid .. " 2>/dev/null")
  local deadline = core.now() + 5 * helpers.slow
  while alive(self.pid) and core.now() < deadline do core.sleep(0.01) end
  if alive(self.pid) then os.execute("kill -9 " .. self.pid .. " 2>/dev/null") end
  os.execute("rm -rf " .. sh_quote(self.dir))
  self.pid = nil
end

--- Runs redis-cli against the server; returns its output without the last newline.
function Server:cli(...)
  local args = { "redis-cli", "-p", self.port }
  if self.password then
    args[#args + 1] = "--no-auth-warning -a " .. sh_quote(self.password)
  end
  for _, a in ipairs({ ... }) do args[#args + 1] = sh_quote(a) end
  return (run(table.concat(args, " ")):gsub("\n$", ""))
end

--- A redislock client for this server; opts are merged over { port = ... }.
function Server:client(opts)
  local o = { port = self.port }
  for k, v in pairs(opts or {}) do o[k] = v end
  return require("redislock").new(o)
end

--- A bare core client, for raw commands in checks (its own connection).
function Server:raw()
  return core.new({ port = self.port, password = self.password })
end

--- Starts `lua script args...` in the background with the suite's interpreter
-- and module paths; returns a handle whose :wait() gives the output and success.
function helpers.spawn(script, ...)
  local args = { helpers.lua, sh_quote(script) }
  for _, a in ipairs({ ... }) do args[#args + 1] = sh_quote(a) end
  local p = assert(io.popen("(" .. table.concat(args, " ") .. ") 2>&1; echo __EXIT:$?"))
  return { wait = function() return finish(p) end }
end

--- Calls fn until it returns a true value or `seconds` pass; returns its last value.
function helpers.eventually(seconds, fn)
  local deadline = core.now() + seconds * helpers.slow
  local v = fn()
  while not v and core.now() < deadline do
    core.sleep(0.01)
    v = fn()
  end
  return v
end

helpers.spec_dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "spec/"

return helpers
