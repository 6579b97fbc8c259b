-- SPDX-License-Identifier: MIT
-- Test helpers: private redis-servers on free loopback ports, started and stopped
-- by the specs (by PID), worker processes, and small utilities. No mocks: every
-- spec talks to a real redis-server. The topologies and other servers have
-- files of their own, which add their functions here: spec/helpers/sentinel.lua,
-- cluster.lua, redlock.lua, postgres.lua and nginx.lua.
local core = require("redislock.core")
local socket = require("socket")
local read_file = require("tools.read_file")
local unpack = table.unpack or unpack -- luacheck: ignore (LuaJIT's global)

local helpers = {}

-- Valgrind or sanitizers slow everything down: timing bounds are widened.
helpers.slow = os.getenv("REDISLOCK_SLOW") ~= nil and 10 or 1

-- The suite runs in a network namespace of its own (spec/run.sh, as root):
-- servers may listen on other 127.0.0.x addresses, and iptables may cut
-- them apart (the rules die with the namespace).
helpers.netns = os.getenv("REDISLOCK_NETNS") == "1"

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
helpers.Server = Server -- for spec/helpers/*.lua

-- Throwaway certificates, made once per process with openssl (nothing secret
-- is committed): a CA and a server certificate it signed (SANs DNS:localhost
-- and IP:127.0.0.1), a client certificate it signed, a second, unrelated CA
-- ("other"), and a key that matches no certificate ("stray"). Returns the
-- folder; files <name>.crt and <name>.key in it.
local cert_dir
function helpers.tls_certs()
  if cert_dir then return cert_dir end
  local dir = tmpdir()
  local q = sh_quote(dir)
  local newkey = "-nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1"
  local steps = {
    "openssl req -x509 " .. newkey .. " -keyout ca.key -out ca.crt -days 2 -subj /CN=redislock-test-ca",
    "openssl req -x509 " .. newkey .. " -keyout other.key -out other.crt -days 2 -subj /CN=redislock-other-ca",
    "openssl req -new " .. newkey .. " -keyout server.key -out server.csr -subj /CN=localhost",
    "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n' > server.ext",
    "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2"
      .. " -extfile server.ext",
    "openssl req -new " .. newkey .. " -keyout client.key -out client.csr -subj /CN=redislock-client",
    "printf 'extendedKeyUsage=clientAuth\\n' > client.ext",
    "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 2"
      .. " -extfile client.ext",
    "openssl req -new " .. newkey .. " -keyout stray.key -out stray.csr -subj /CN=stray",
    "chmod 644 *.crt *.key",
  }
  for _, step in ipairs(steps) do
    local out, ok = run("cd " .. q .. " && " .. step .. " 2>&1")
    assert(ok, "cannot make test certificates: " .. step .. "\n" .. out)
  end
  cert_dir = dir
  return dir
end

--- Client options for a TLS server: verified as "localhost", with the test
-- CA and the client certificate; extra is merged over them.
function helpers.tls_opts(port, extra)
  local dir = helpers.tls_certs()
  local o = { host = "localhost", port = port,
              tls = { ca = dir .. "/ca.crt", cert = dir .. "/client.crt", key = dir .. "/client.key" } }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

--- Starts a private redis-server (daemon, by PID) on a free loopback port,
-- with a plaintext unix socket beside it; extra is a list of more arguments
-- (e.g. { "--requirepass", "s3cret" }); opts.cluster: a cluster node, its
-- bus on port + 10000 (so the port is at most 55535); opts.tls = "yes" or "optional"
-- (tls-auth-clients): TCP only over TLS (helpers.tls_certs), srv.port being
-- the TLS port and srv.where "tls:<port>:<cert folder>" (for the workers).
-- Raises when it cannot start.
function helpers.start_redis(extra, opts)
  local max_port = opts and opts.cluster and 55535 or 65535
  local tls = opts and opts.tls
  local host = opts and opts.host or "127.0.0.1"
  assert(host == "127.0.0.1" or helpers.netns, "another loopback address than 127.0.0.1 needs the suite's own network "
         .. "namespace (helpers.netns)")
  local last_log = ""
  for _ = 1, 5 do
    local port = helpers.free_port()
    while port > max_port do port = helpers.free_port() end
    local dir = tmpdir()
    local args = {
      "redis-server", "--bind", host, "--port", tls and 0 or port, "--save", "''", "--appendonly", "no",
      "--daemonize", "yes", "--pidfile", sh_quote(dir .. "/redis.pid"),
      "--logfile", sh_quote(dir .. "/redis.log"), "--dir", sh_quote(dir),
      "--unixsocket", sh_quote(dir .. "/redis.sock"), "--unixsocketperm", "700",
      "--enable-debug-command", "local",
    }
    if tls then
      local certs = helpers.tls_certs()
      for _, a in ipairs({ "--tls-port", port, "--tls-cert-file", certs .. "/server.crt",
                           "--tls-key-file", certs .. "/server.key", "--tls-ca-cert-file", certs .. "/ca.crt",
                           "--tls-auth-clients", tls }) do
        args[#args + 1] = sh_quote(a)
      end
    end
    -- Its own connections (replication, a cluster's bus) come from its own
    -- address; protected mode would take that for a remote one.
    if host ~= "127.0.0.1" then args[#args + 1] = "--bind-source-addr " .. host .. " --protected-mode no" end
    for _, a in ipairs(extra or {}) do args[#args + 1] = sh_quote(a) end
    -- A cluster node's bus is on port + 10000 (which Redis derives from
    -- --port, 0 when it listens on TLS only).
    if opts and opts.cluster then args[#args + 1] = "--cluster-port " .. port + 10000 end
    local cmd = table.concat(args, " ")
    run(cmd)
    local deadline = core.now() + 5 * helpers.slow
    while core.now() < deadline do
      local log = read_file(dir .. "/redis.log") or ""
      local pid = tonumber(read_file(dir .. "/redis.pid") or "")
      if pid and log:find("Ready to accept connections", 1, true) then
        return setmetatable({ host = host, port = port, dir = dir, pid = pid, sock = dir .. "/redis.sock",
                              password = nil, tls = tls and true, cmd = cmd,
                              url = (tls and "rediss://localhost:" or "redis://" .. host .. ":") .. port,
                              where = tls and ("tls:" .. port .. ":" .. helpers.tls_certs()) or tostring(port) },
                            Server)
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

-- busted's hooks (lazy_setup, before_each ...) for the describe block being
-- defined: a spec file gets them as globals, a module through require
-- "busted" (asked when a helper runs, as torture/ loads this file outside
-- busted). A helper's second argument is never a function: one is busted's
-- lazy_teardown, from a call in the form these helpers once took (hooks
-- first), refused with a message that says so.
local function hooks(fname, second)
  if type(second) == "function" then
    error("helpers." .. fname .. " takes no busted hooks (it registers them itself): pass ready first", 3)
  end
  return require("busted")
end

--- A private redis-server and a raw core client on it for the enclosing
-- describe block: started in its lazy_setup, stopped in its lazy_teardown.
-- ready(srv, raw) is called once both are up, to keep them in the spec's locals.
-- With opts.flush, the server is flushed before each test.
function helpers.redis_for(ready, opts)
  local srv, raw
  local busted = hooks("redis_for", opts)
  busted.lazy_setup(function()
    srv = helpers.start_redis()
    raw = srv:raw()
    ready(srv, raw)
  end)
  busted.lazy_teardown(function()
    if raw then raw:close() end
    if srv then srv:stop() end
  end)
  if opts and opts.flush then
    busted.before_each(function() assert(raw:command("FLUSHALL") == "OK", "FLUSHALL failed") end)
  end
end

--- helpers.redis_for's server and raw client, and a redislock client on
-- the server (closed in lazy_teardown); the server is flushed before each
-- test. ready(srv, raw, client) keeps them in the spec's locals.
function helpers.client_for(ready, ...)
  local client
  local busted = hooks("client_for", (...))
  helpers.redis_for(function(s, r)
    client = require("redislock").new({ port = s.port })
    ready(s, r, client)
  end, { flush = true })
  busted.lazy_teardown(function() if client then client:close() end end)
end

--- helpers.redis_for's server and raw client, flushed before each test,
-- and a new client on it (srv:client()) for each test, closed after it;
-- ready(srv, raw, client) keeps them in the spec's locals.
function helpers.client_each(ready, ...)
  local srv, raw, client
  local busted = hooks("client_each", (...))
  helpers.redis_for(function(s, r) srv, raw = s, r end, { flush = true })
  busted.before_each(function()
    client = srv:client()
    ready(srv, raw, client)
  end)
  busted.after_each(function() client:close() end)
end

--- Loads the lock scripts through client (a lock taken and released), then
-- flushes the server raw is on and resets its statistics (CONFIG RESETSTAT),
-- so that counts of scripts run start at 0 and no NOSCRIPT round trip adds
-- to them.
function helpers.warm(client, raw)
  assert(assert(client:acquire("warm-up", 1)):release())
  assert(raw:command("FLUSHALL") == "OK", "FLUSHALL failed")
  assert(raw:command("CONFIG", "RESETSTAT") == "OK", "CONFIG RESETSTAT failed")
end

--- helpers.redis_for's server and raw client, and a temporary folder of the
-- describe block's own (removed in lazy_teardown); before each test the
-- server is flushed and the folder emptied. ready(srv, raw, dir) keeps them
-- in the spec's locals.
function helpers.redis_and_dir_for(ready, ...)
  local dir
  local busted = hooks("redis_and_dir_for", (...))
  helpers.redis_for(function(s, r)
    dir = tmpdir()
    ready(s, r, dir)
  end, { flush = true })
  busted.lazy_teardown(function()
    if dir then os.execute("rm -rf " .. sh_quote(dir)) end
  end)
  busted.before_each(function() os.execute("rm -rf " .. sh_quote(dir) .. "/*") end)
end

--- A replica of the server master (a redis-server as helpers.start_redis
-- starts it, with the more arguments extra).
function helpers.start_replica(master, extra)
  local args = { "--replicaof", "127.0.0.1", tostring(master.port) }
  for _, a in ipairs(extra or {}) do args[#args + 1] = a end
  return helpers.start_redis(args)
end

--- A server (extra: its arguments, as helpers.start_redis takes them) and
-- a replica of it; returns both.
function helpers.start_with_replica(extra)
  local master = helpers.start_redis(extra)
  return master, helpers.start_replica(master)
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

--- Restarts the server on the same port and folder (its data set is loaded
-- from the folder's dump.rdb or append-only files, if any): SIGTERM by PID,
-- then the same command. With wipe, it is killed (SIGKILL) and its data
-- files removed first: it comes back empty, as a server without persistence;
-- then wipe, if a function, is called while the server is down.
-- Returns as soon as the new process listens, which may be while it still
-- loads its data (it answers -LOADING then). Raises when it cannot restart.
function Server:restart(wipe)
  assert(self.pid, "the server was stopped")
  os.execute("kill " .. (wipe and "-9 " or "") .. self.pid .. " 2>/dev/null")
  assert(helpers.eventually(10, function() return not alive(self.pid) end), "redis-server would not stop")
  os.remove(self.dir .. "/redis.pid")
  if wipe then run("rm -rf " .. sh_quote(self.dir .. "/appendonlydir") .. " " .. sh_quote(self.dir .. "/dump.rdb")) end
  if type(wipe) == "function" then wipe() end
  run(self.cmd)
  local listening = helpers.eventually(10, function()
    self.pid = tonumber(read_file(self.dir .. "/redis.pid") or "")
    if not self.pid then return false end
    local c = socket.tcp()
    c:settimeout(1)
    local ok = c:connect(self.host, self.port)
    c:close()
    return ok
  end)
  assert(listening, "redis-server did not come back; its log says:\n" .. (read_file(self.dir .. "/redis.log") or ""))
end

--- Runs redis-cli against the server; returns its output without the last newline.
function Server:cli(...)
  local args = self.tls and { "redis-cli", "-s", sh_quote(self.sock) }
    or { "redis-cli", "-h", self.host, "-p", self.port }
  if self.password then
    args[#args + 1] = "--no-auth-warning -a " .. sh_quote(self.password)
  end
  for _, a in ipairs({ ... }) do args[#args + 1] = sh_quote(a) end
  return (run(table.concat(args, " ")):gsub("\n$", ""))
end

--- A redislock client for this server; opts are merged over { port = ... }.
function Server:client(opts)
  local o = self.tls and helpers.tls_opts(self.port) or { host = self.host, port = self.port }
  for k, v in pairs(opts or {}) do o[k] = v end
  return require("redislock").new(o)
end

--- A bare core client, for raw commands in checks (its own connection).
function Server:raw()
  if self.tls then return core.new({ path = self.sock, password = self.password }) end
  return core.new({ host = self.host, port = self.port, password = self.password })
end

--- Runs four looping workers across event() and checks what they printed
-- (spec/workers/loop.lua): one line per section that returned ok, "ok
-- <enter> <leave> <port> <fence>[ <token>]" (core.now() times; port: the
-- node it ran on), and "err ..." lines. spawn(start_at) starts one worker
-- (helpers.spawn), looping from start_at for some seconds (6 in most
-- specs); event() runs 2 s in.
-- Checks (with busted's assert): every worker ended with "done"; errors
-- only with code words; no two sections overlapped; with fences, every
-- section's fence larger than the one of the section before, or equal when
-- both give the same token (a lock handed down within an nginx worker,
-- redislock/ngx_gate.lua). Returns the sections ({ enter, leave, port,
-- fence, worker, token }) in order of entry.
function helpers.loops_across(spawn, event, fences, n)
  local start_at = core.now() + 0.5
  local procs = {}
  for i = 1, n or 4 do procs[i] = spawn(start_at) end
  core.sleep(2)
  event()
  local sections, codes = {}, { busy = true, lost = true, connection = true, redis = true }
  for i = 1, #procs do
    local out, ok = procs[i].wait()
    assert(ok and out:match("done\n?$"), "worker " .. i .. ": " .. out)
    for line in out:gmatch("[^\n]+") do
      local enter, leave, port, fence, token = line:match("^ok (%S+) (%S+) (%d+) (%d+) ?(%S*)$")
      if enter then
        sections[#sections + 1] = { enter = tonumber(enter), leave = tonumber(leave), port = tonumber(port),
                                    fence = tonumber(fence), worker = i, token = token ~= "" and token or nil }
      elseif line:match("^err ") then
        assert(codes[line:match("(%a+): ") or ""], "an error without its code word: " .. line)
      end
    end
  end
  table.sort(sections, function(a, b) return a.enter < b.enter end)
  for i = 2, #sections do
    local a, b = sections[i - 1], sections[i]
    assert(b.enter >= a.leave, string.format("worker %d (%.4f-%.4f on %d) and worker %d (%.4f-%.4f on %d) overlap",
                                             a.worker, a.enter, a.leave, a.port, b.worker, b.enter, b.leave, b.port))
    assert(not fences or b.fence > a.fence or (b.fence == a.fence and b.token and b.token == a.token),
           string.format("fence %d (worker %d) after fence %d (worker %d)", b.fence, b.worker, a.fence, a.worker))
  end
  return sections
end

--- Adds (how "-A") or deletes ("-D") the iptables rules that drop every
-- packet between the loopback addresses a and b, both ways; with share (0 to
-- 1), that share of them, at random (a lossy link: TCP resends, late).
-- Delete with the same share. Needs helpers.netns (the rules go with the
-- suite's namespace).
function helpers.drop_between(how, a, b, share)
  local random = share and string.format(" -m statistic --mode random --probability %.3f", share) or ""
  for _, dir in ipairs({ { a, b }, { b, a } }) do
    assert(os.execute("iptables " .. how .. " INPUT -s " .. dir[1] .. " -d " .. dir[2] .. random .. " -j DROP"),
           "iptables " .. how .. " failed")
  end
end

-- The checkout's root as an absolute path (nginx runs from its own prefix, so
-- relative paths will not do); worked out once.
local repo_root
function helpers.root()
  if not repo_root then
    local out, ok = run("cd " .. sh_quote(helpers.spec_dir .. "..") .. " && pwd -P")
    repo_root = out:gsub("%s+$", "")
    assert(ok and repo_root:match("^/"), "cannot find the repository root: " .. out)
  end
  return repo_root
end

--- Starts `lua script args...` in the background with the suite's interpreter
-- and module paths; returns a handle whose :wait() gives the output and success.
function helpers.spawn(script, ...)
  local args = { helpers.lua, sh_quote(script) }
  for _, a in ipairs({ ... }) do args[#args + 1] = sh_quote(a) end
  -- The outer shell's own stderr is dropped: a worker a spec SIGKILLs on
  -- purpose would make it print a bare "Killed" into the suite's output.
  local p = assert(io.popen("{ (" .. table.concat(args, " ") .. ") 2>&1; echo __EXIT:$?; } 2>/dev/null"))
  return { wait = function() return finish(p) end }
end

--- Whether something accepts a TCP connection on 127.0.0.1:port now.
function helpers.accepts(port)
  local c = socket.tcp()
  c:settimeout(1)
  local ok = c:connect("127.0.0.1", port)
  c:close()
  return ok ~= nil
end

--- Starts one of the spec's TCP proxies (spec/workers/<name>.lua, which
-- takes its listen port first and its quit file last, args between) and
-- waits until it listens. Returns its port, and a function that stops it
-- (the quit file) and returns its output and success.
function helpers.start_proxy(name, ...)
  local port, quit = helpers.free_port(), os.tmpname()
  os.remove(quit)
  local args = { port, ... }
  args[#args + 1] = quit
  local p = helpers.spawn(helpers.spec_dir .. "workers/" .. name .. ".lua", unpack(args))
  assert(helpers.eventually(5, function() return helpers.accepts(port) end), name .. " never listened")
  return port, function()
    io.open(quit, "w"):close()
    local out, ok = p.wait()
    os.remove(quit)
    return out, ok
  end
end

--- Waits for worker processes (handles from helpers.spawn) whose output
-- ends with "overlaps N" (spec/workers/counter.lua, primitive.lua); raises
-- naming a worker that failed or said no count; returns the sum of N.
function helpers.overlaps(procs)
  local sum = 0
  for i, p in ipairs(procs) do
    local out, ok = p.wait()
    local n = tonumber(out:match("overlaps (%d+)"))
    if not ok or not n then error("worker " .. i .. " failed: " .. out, 2) end
    sum = sum + n
  end
  return sum
end

--- Calls fn until it returns a true value or `seconds` pass; returns its last value.
-- It asks every 10 ms at first, then less often the longer it has waited (a
-- tenth of that, at most every 100 ms): many fn spawn redis-cli, and a
-- sentinel or cluster that takes seconds to agree would otherwise keep a
-- core busy with them, which the specs running beside it feel.
function helpers.eventually(seconds, fn)
  local start = core.now()
  local deadline = start + seconds * helpers.slow
  local v = fn()
  while not v and core.now() < deadline do
    core.sleep(math.min(0.1, math.max(0.01, (core.now() - start) / 10)))
    v = fn()
  end
  return v
end

--- spec/workers/primitive.lua (a semaphore's, a read-write lock's or a
-- multi-key lock's holds, counted) against server (a port, or a
-- "cluster:..." list), with its other arguments, as helpers.spawn runs it.
function helpers.spawn_primitive(server, ...)
  return helpers.spawn(helpers.spec_dir .. "workers/primitive.lua", server, ...)
end

--- A holder SIGKILLed: spawn_primitive's "permit" worker (a permit of
-- semaphore "pool" and a read hold of read-write lock "doc", each with a
-- 1 s TTL) on srv, killed once it holds (its PID on the list "holders",
-- read through raw); returns once it is gone. what names it in the error.
function helpers.killed_holder(srv, raw, what)
  local proc = helpers.spawn_primitive(srv.port, "permit", core.now(), 1)
  local pid = helpers.eventually(5, function() return raw:command("LINDEX", "holders", 0) end)
  assert(pid, what .. " never took its hold")
  assert(helpers.sh_ok("kill -KILL " .. pid), "cannot kill " .. what)
  proc.wait()
end

--- The PID the i-th worker announced (spec/workers/*.lua push theirs on
-- the list "pids" of their server; raw is a core client of it), once it
-- did (5 s at most).
function helpers.pid_of(raw, i)
  assert(helpers.eventually(5, function() return raw:command("LLEN", "pids") >= i end),
         "worker " .. i .. " never announced its PID")
  return raw:command("LINDEX", "pids", i - 1)
end

--- Asserts that c:acquire(key, 5) fails with an error that matches
-- pattern (found as plain text with plain); returns the error.
function helpers.acquire_fails(c, key, pattern, plain)
  local lock, err = c:acquire(key, 5)
  assert(lock == nil, "took " .. key)
  assert(tostring(err):find(pattern, 1, plain), "the error " .. tostring(err) .. " does not match " .. pattern)
  return err
end

--- Asserts that redislock.new(opts) raises an error that holds msg (plain text).
function helpers.new_fails(opts, msg)
  local ok, err = pcall(require("redislock").new, opts)
  assert(not ok, "new took the options")
  assert(tostring(err):find(msg, 1, true), "the error " .. tostring(err) .. " does not hold " .. msg)
end

--- How many clients the server raw (a core client) has blocked right now
-- (waiters in BLPOP).
function helpers.blocked(raw)
  return tonumber(raw:command("INFO", "clients"):match("blocked_clients:(%d+)"))
end

--- The fence a fence record's ID "<ms>-<seq>" stands for (csrc/scripts/README.md,
-- "Fences"): (ms - core.FENCE_EPOCH_MS) * core.FENCE_SCALE + seq; with
-- seq 0, the lowest fence a server whose clock reads ms hands out.
function helpers.id_fence(ms, seq)
  return (ms - core.FENCE_EPOCH_MS) * core.FENCE_SCALE + (seq or 0)
end

--- The slot's fence record of key (under prefix, "lock:" by default) on the
-- server raw: its name, and the last fence it stands for (its stream's
-- last ID "<ms>-<seq>": helpers.id_fence), or nil when there is none.
function helpers.fence_record(raw, key, prefix)
  local name = (prefix or "lock:") .. "{" .. core.era_tag(core.lock_slot(key)) .. "}:fences"
  if raw:command("TYPE", name) ~= "stream" then return name, nil end
  local info = raw:command("XINFO", "STREAM", name)
  for i = 1, #info, 2 do
    if info[i] == "last-generated-id" then
      local ms, seq = info[i + 1]:match("^(%d+)%-(%d+)$")
      return name, helpers.id_fence(tonumber(ms), tonumber(seq))
    end
  end
  return name, nil
end

--- Lock scripts the server raw has run since its last CONFIG RESETSTAT (an
-- EVALSHA refused with NOSCRIPT, then sent as EVAL, counts once).
function helpers.scripts_run(raw)
  local n = 0
  local stats = raw:command("INFO", "commandstats")
  for calls, failed in stats:gmatch("cmdstat_eval%a*:calls=(%d+)[^\r\n]*failed_calls=(%d+)") do
    n = n + tonumber(calls) - tonumber(failed)
  end
  return n
end

helpers.spec_dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "spec/"

-- What the topologies' own files (spec/helpers/*.lua) use, and what they add.
helpers.tmpdir, helpers.alive = tmpdir, alive
for _, topic in ipairs({ "sentinel", "cluster", "redlock", "postgres", "nginx" }) do
  require("spec.helpers." .. topic)(helpers)
end

return helpers
