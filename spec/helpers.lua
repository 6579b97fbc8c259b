-- SPDX-License-Identifier: MIT
-- Test helpers: private redis-servers on free loopback ports, started and stopped
-- by the specs (by PID), worker processes, and small utilities. No mocks: every
-- spec talks to a real redis-server.
local core = require "redislock.core"
local socket = require "socket"

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

--- A private redis-server and a raw core client on it for the enclosing
-- describe block: started in its lazy_setup, stopped in its lazy_teardown
-- (busted's hooks are passed in: a required module does not see them).
-- ready(srv, raw) is called once both are up, to keep them in the spec's locals.
function helpers.redis_for(lazy_setup, lazy_teardown, ready)
  local srv, raw
  lazy_setup(function()
    srv = helpers.start_redis()
    raw = srv:raw()
    ready(srv, raw)
  end)
  lazy_teardown(function()
    if raw then raw:close() end
    if srv then srv:stop() end
  end)
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

local Group = {}
Group.__index = Group

--- Starts a Sentinel group on loopback: a master, a replica of it and three
-- sentinels (quorum 2, down-after-milliseconds 1000, failover-timeout 5000)
-- watching it as "mymaster", each by PID under a folder of its own. Returns
-- once every sentinel knows the replica and the two other sentinels (until
-- then SENTINEL FAILOVER answers NOGOODSLAVE). group.nodes = { master,
-- replica } (Servers; which is master changes with a failover),
-- group.sentinels = { Server-like { port, pid, dir } ... }, group.addrs =
-- { "127.0.0.1:<port>", ... } (the sentinels, for the client option).
-- Raises when it cannot start.
-- Starts one sentinel watching master_port as "mymaster" (quorum 2), with
-- more configuration lines; returns it (a Server), or raises.
local function start_sentinel(master_port, more)
  local dir, port = tmpdir(), helpers.free_port()
  local lines = {
    "port " .. port, "bind 127.0.0.1", "daemonize yes",
    "pidfile " .. dir .. "/sentinel.pid", "logfile " .. dir .. "/sentinel.log", "dir " .. dir,
    "sentinel monitor mymaster 127.0.0.1 " .. master_port .. " 2",
    "sentinel down-after-milliseconds mymaster 1000",
    "sentinel failover-timeout mymaster 5000",
    "sentinel parallel-syncs mymaster 1" }
  for _, l in ipairs(more or {}) do lines[#lines + 1] = l end
  local f = assert(io.open(dir .. "/sentinel.conf", "w"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  run("redis-server " .. sh_quote(dir .. "/sentinel.conf") .. " --sentinel")
  local up = helpers.eventually(5, function()
    local pid = tonumber(read_file(dir .. "/sentinel.pid") or "")
    return pid and (read_file(dir .. "/sentinel.log") or ""):find("+monitor master", 1, true) and pid
  end)
  if not up then
    local log = read_file(dir .. "/sentinel.log") or ""
    local pid = tonumber(read_file(dir .. "/sentinel.pid") or "")
    if pid then os.execute("kill " .. pid .. " 2>/dev/null") end
    error("cannot start redis-server --sentinel; its log says:\n" .. log)
  end
  return setmetatable({ host = "127.0.0.1", port = port, dir = dir, pid = up }, Server)
end

function helpers.start_sentinels()
  local master = helpers.start_redis()
  local replica = helpers.start_redis({ "--replicaof", "127.0.0.1", tostring(master.port) })
  local g = setmetatable({ nodes = { master, replica }, sentinels = {}, addrs = {}, extra = {}, name = "mymaster" },
                         Group)
  for i = 1, 3 do
    local ok, s = pcall(start_sentinel, master.port)
    if not ok then
      g:stop()
      error(s)
    end
    g.sentinels[i] = s
    g.addrs[i] = "127.0.0.1:" .. s.port
  end
  local ready = helpers.eventually(30, function()
    for _, s in ipairs(g.sentinels) do
      local replicas = s:cli("SENTINEL", "replicas", "mymaster")
      local others = s:cli("SENTINEL", "sentinels", "mymaster")
      if not replicas:find(tostring(replica.port), 1, true) then return false end
      local n = 0
      for _ in others:gmatch("\nrunid\n") do n = n + 1 end
      if others:match("^runid\n") then n = n + 1 end
      if n < 2 then return false end
    end
    return true
  end)
  if not ready then
    g:stop()
    error("the sentinels never saw the replica and each other")
  end
  return g
end

--- The node the sentinels name as master now (a Server of group.nodes).
function Group:master()
  local out = self.sentinels[1]:cli("SENTINEL", "get-master-addr-by-name", self.name)
  local port = tonumber(out:match("\n(%d+)$"))
  for _, n in ipairs(self.nodes) do
    if n.port == port then return n end
  end
  error("the sentinels name no node of the group: " .. out)
end

--- Waits until the node that is not the master has its replication link up
-- (after a failover it first resynchronizes); true, or false after 30 s.
function Group:caught_up()
  local m = self:master()
  local replica = m == self.nodes[1] and self.nodes[2] or self.nodes[1]
  return helpers.eventually(30, function()
    return replica:cli("INFO", "replication"):find("master_link_status:up", 1, true) ~= nil
  end)
end

--- Runs SENTINEL FAILOVER on the first sentinel and waits until every
-- sentinel names the other node; returns the old master and the new one.
function Group:failover()
  local old = self:master()
  local new = old == self.nodes[1] and self.nodes[2] or self.nodes[1]
  local said = helpers.eventually(30, function()
    local out = self.sentinels[1]:cli("SENTINEL", "FAILOVER", self.name)
    return out == "OK" and out
  end)
  assert(said, "SENTINEL FAILOVER never said OK")
  local switched = helpers.eventually(15, function()
    for _, s in ipairs(self.sentinels) do
      local out = s:cli("SENTINEL", "get-master-addr-by-name", self.name)
      if tonumber(out:match("\n(%d+)$")) ~= new.port then return false end
    end
    return true
  end)
  assert(switched, "the sentinels never named the new master")
  return old, new
end

--- Starts one more sentinel for the group's master now, with more
-- configuration lines (e.g. { "requirepass pw" }); it votes in no failover
-- of the group's (the others cannot talk to it when it wants AUTH) and is
-- stopped with the group. Returns it (a Server).
function Group:extra_sentinel(more)
  local s = start_sentinel(self:master().port, more)
  self.extra[#self.extra + 1] = s
  return s
end

--- Runs four looping workers across event() and checks what they printed
-- (spec/workers/loop.lua): one line per section that returned ok, "ok
-- <enter> <leave> <port> <fence>" (core.now() times; port: the node it ran
-- on), and "err ..." lines. spawn(start_at) starts one worker
-- (helpers.spawn), looping from start_at for some seconds (6 in most
-- specs); event() runs 2 s in.
-- Checks (with busted's assert): every worker ended with "done"; errors
-- only with code words; no two sections overlapped; with fences, every
-- section's fence larger than the one of the section before. Returns the
-- sections ({ enter, leave, port, fence, worker }) in order of entry.
function helpers.loops_across(spawn, event, fences)
  local start_at = core.now() + 0.5
  local procs = {}
  for i = 1, 4 do procs[i] = spawn(start_at) end
  core.sleep(2)
  event()
  local sections, codes = {}, { busy = true, lost = true, connection = true, redis = true }
  for i = 1, #procs do
    local out, ok = procs[i].wait()
    assert(ok and out:match("done\n?$"), "worker " .. i .. ": " .. out)
    for line in out:gmatch("[^\n]+") do
      local enter, leave, port, fence = line:match("^ok (%S+) (%S+) (%d+) (%d+)$")
      if enter then
        sections[#sections + 1] = { enter = tonumber(enter), leave = tonumber(leave), port = tonumber(port),
                                    fence = tonumber(fence), worker = i }
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
    assert(not fences or b.fence > a.fence, string.format("fence %d (worker %d) after fence %d (worker %d)",
                                                          b.fence, b.worker, a.fence, a.worker))
  end
  return sections
end

--- helpers.loops_across a SENTINEL FAILOVER of the group: also checks that
-- more than 10 sections ran on the new master, and none on the demoted
-- master once every sentinel named the new one (0.1 s for the
-- announcement to arrive).
function Group:loops_across_failover(spawn)
  local old, new, named = self:master(), nil, nil
  local sections = helpers.loops_across(spawn, function()
    local _
    _, new = self:failover()
    named = core.now()
  end)
  local on_new = 0
  for _, s in ipairs(sections) do if s.port == new.port then on_new = on_new + 1 end end
  assert(on_new > 10, "sections on the new master: " .. on_new)
  for _, s in ipairs(sections) do
    assert(not (s.port == old.port and s.enter > named + 0.1),
           string.format("a section on the demoted master %.3f s after the switch", s.enter - named))
  end
  return sections
end

local Cluster = {}
Cluster.__index = Cluster

--- Starts a Redis Cluster on loopback: 3 masters and 3 replicas
-- (cluster-node-timeout 2000), each by PID under a folder of its own (ports
-- at most 55535: the cluster bus is port + 10000), made one cluster by
-- `redis-cli --cluster create --cluster-replicas 1`. Returns once every node
-- says cluster_state:ok and all agree on the slots. cluster.nodes = { Server
-- ... }, cluster.seeds = { "127.0.0.1:<port>", ... } (for the client
-- option). opts.masters (3) and opts.replicas (1 per master); opts.tls and
-- opts.password: the nodes take clients and talk to each other over TLS
-- only (helpers.tls_certs), and want that password (nodes keep a plaintext
-- unix socket for the checks, where CLUSTER SLOTS gives port 0).
-- opts.node_timeout: cluster-node-timeout (ms); opts.full_coverage = false:
-- the slots of the other masters are served while one master is down;
-- opts.extra: more arguments for every node (e.g. its append-only file). opts.own_addresses: node i
-- listens on 127.0.0.(10 + i), so that cluster:isolate can cut it off the
-- others (needs helpers.netns). Raises when it cannot start.
function helpers.start_cluster(opts)
  opts = opts or {}
  local masters, replicas = opts.masters or 3, opts.replicas or 1
  local c = setmetatable({ nodes = {}, seeds = {} }, Cluster)
  local ok, err = pcall(function()
    local extra = { "--cluster-enabled", "yes", "--cluster-node-timeout", tostring(opts.node_timeout or 2000),
                    "--cluster-require-full-coverage", opts.full_coverage == false and "no" or "yes" }
    for _, a in ipairs(opts.extra or {}) do extra[#extra + 1] = a end
    local cli = "redis-cli"
    if opts.tls then
      local certs = helpers.tls_certs()
      -- The server certificate is for serverAuth only: nodes connect to
      -- each other with the client one.
      for _, a in ipairs({ "--tls-cluster", "yes", "--tls-replication", "yes", "--tls-client-cert-file",
                           certs .. "/client.crt", "--tls-client-key-file", certs .. "/client.key" }) do
        extra[#extra + 1] = a
      end
      cli = cli .. " --tls --cacert " .. sh_quote(certs .. "/ca.crt") .. " --cert " .. sh_quote(certs .. "/client.crt")
            .. " --key " .. sh_quote(certs .. "/client.key")
    end
    if opts.password then
      for _, a in ipairs({ "--requirepass", opts.password, "--masterauth", opts.password }) do extra[#extra + 1] = a end
      cli = cli .. " --no-auth-warning -a " .. sh_quote(opts.password)
    end
    for i = 1, masters * (1 + replicas) do
      c.nodes[i] = helpers.start_redis(extra, { cluster = true, tls = opts.tls and "yes" or nil,
                                                host = opts.own_addresses and "127.0.0." .. (10 + i) or nil })
      c.nodes[i].password = opts.password
      c.seeds[i] = c.nodes[i].host .. ":" .. c.nodes[i].port
    end
    local out, created = run("timeout 60 " .. cli .. " --cluster create " .. table.concat(c.seeds, " ")
                             .. " --cluster-replicas " .. replicas .. " --cluster-yes 2>&1")
    assert(created, "redis-cli --cluster create failed:\n" .. out)
    assert(c:settled(30), "the cluster never settled")
  end)
  if not ok then
    c:stop()
    error(err)
  end
  return c
end

--- Waits (up to seconds) until every running node says cluster_state:ok and
-- all of them give the same masters for the same slots; true, or false.
function Cluster:settled(seconds)
  return helpers.eventually(seconds, function()
    local seen
    for _, n in ipairs(self.nodes) do
      if n.pid then
        if not n:cli("CLUSTER", "INFO"):find("cluster_state:ok", 1, true) then return false end
        local _, slots = self:ranges(n)
        if seen and seen ~= slots then return false end
        seen = slots
      end
    end
    return true
  end)
end

-- The slot ranges node n tells (CLUSTER SLOTS), as { { first, last, node
-- id of the master }, ... } sorted, and the same as one string.
function Cluster.ranges(_, n)
  local raw = n:raw()
  local reply = assert(raw:command("CLUSTER", "SLOTS"))
  raw:close()
  local ranges, text = {}, {}
  for _, r in ipairs(reply) do ranges[#ranges + 1] = { r[1], r[2], r[3][3] } end
  table.sort(ranges, function(a, b) return a[1] < b[1] end)
  for i, r in ipairs(ranges) do text[i] = table.concat(r, "-") end
  return ranges, table.concat(text, ",")
end

--- The node (a Server) that serves slot as master now, by what node n (the
-- first running node, if not given) says.
function Cluster:owner(slot, n)
  if not n then
    for _, m in ipairs(self.nodes) do
      if m.pid then
        n = m
        break
      end
    end
  end
  for _, r in ipairs((self:ranges(n))) do
    if slot >= r[1] and slot <= r[2] then
      for _, m in ipairs(self.nodes) do
        if m.pid and self:id(m) == r[3] then return m end
      end
    end
  end
  error("no node serves slot " .. slot)
end

--- Starts moving slot from one master to another (Servers): SETSLOT
-- IMPORTING on the target, MIGRATING on the source. The keys stay on the
-- source until move_keys.
function Cluster:begin_move(slot, from, to)
  assert(to:cli("CLUSTER", "SETSLOT", slot, "IMPORTING", self:id(from)) == "OK")
  assert(from:cli("CLUSTER", "SETSLOT", slot, "MIGRATING", self:id(to)) == "OK")
end

--- MIGRATEs every key of slot from the source to the target.
function Cluster.move_keys(_, slot, from, to)
  while true do
    local keys = {}
    for k in from:cli("CLUSTER", "GETKEYSINSLOT", slot, 100):gmatch("[^\n]+") do keys[#keys + 1] = k end
    if #keys == 0 then return end
    local argv = { "MIGRATE", to.host, to.port, "", 0, 5000 }
    if from.password then
      argv[#argv + 1] = "AUTH"
      argv[#argv + 1] = from.password
    end
    argv[#argv + 1] = "KEYS"
    for _, k in ipairs(keys) do argv[#argv + 1] = k end
    local said = from:cli((table.unpack or unpack)(argv)) -- luacheck: ignore (unpack: LuaJIT)
    assert(said == "OK", "MIGRATE said " .. said)
  end
end

--- Ends the move: SETSLOT NODE on the target, the source and the other
-- masters, as redis-cli --cluster reshard does.
function Cluster:end_move(slot, from, to)
  local id = self:id(to)
  assert(to:cli("CLUSTER", "SETSLOT", slot, "NODE", id) == "OK")
  assert(from:cli("CLUSTER", "SETSLOT", slot, "NODE", id) == "OK")
  for _, n in ipairs(self.nodes) do
    if n.pid and n ~= to and n ~= from and n:cli("ROLE"):match("^master") then
      n:cli("CLUSTER", "SETSLOT", slot, "NODE", id)
    end
  end
end

--- Moves slot, keys and all, from its owner to another master; returns the
-- old owner and the new one.
function Cluster:move(slot, to)
  local from = self:owner(slot)
  to = to or self:other_master(from)
  self:begin_move(slot, from, to)
  self:move_keys(slot, from, to)
  self:end_move(slot, from, to)
  return from, to
end

--- A master other than n (a Server).
function Cluster:other_master(n)
  for _, m in ipairs(self.nodes) do
    if m.pid and m ~= n and m:cli("ROLE"):match("^master") then return m end
  end
  error("no other master")
end

--- How many MOVED (and ASK) errors the running nodes have answered so far
-- (INFO errorstats).
function Cluster:redirects()
  local moved, ask = 0, 0
  for _, n in ipairs(self.nodes) do
    if n.pid then
      local info = n:cli("INFO", "errorstats")
      moved = moved + tonumber(info:match("errorstat_MOVED:count=(%d+)") or "0")
      ask = ask + tonumber(info:match("errorstat_ASK:count=(%d+)") or "0")
    end
  end
  return moved, ask
end

--- The replica (a Server) of master n.
function Cluster:replica_of(n)
  local id = self:id(n)
  for _, m in ipairs(self.nodes) do
    if m.pid and m ~= n and m:cli("CLUSTER", "MYID") ~= id then
      local role = m:cli("ROLE")
      if role:match("^slave") and tonumber(role:match("\n(%d+)\n")) == n.port then return m end
    end
  end
  error("master " .. n.port .. " has no replica")
end

--- The node id of a node (CLUSTER MYID), asked once.
function Cluster.id(_, n)
  n.node_id = n.node_id or n:cli("CLUSTER", "MYID")
  return n.node_id
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

-- Adds (how "-A") or deletes ("-D") the rules that drop every packet
-- between node n and the other nodes (own_addresses); clients on 127.0.0.1
-- still reach it.
local function cut(self, how, n)
  for _, m in ipairs(self.nodes) do
    if m ~= n then helpers.drop_between(how, n.host, m.host) end
  end
end

--- Cuts node n (a Server) off the other nodes: no bus message, no
-- replication either way, until cluster:heal(n). Its clients still reach
-- it. Needs opts.own_addresses (and so helpers.netns).
function Cluster:isolate(n)
  assert(n.host ~= "127.0.0.1", "isolate needs a cluster started with own_addresses")
  cut(self, "-A", n)
  self.isolated = self.isolated or {}
  self.isolated[n] = true
end

--- Undoes isolate(n).
function Cluster:heal(n)
  if not (self.isolated and self.isolated[n]) then return end
  cut(self, "-D", n)
  self.isolated[n] = nil
end

--- Stops every node, by PID (healing what was isolated first).
function Cluster:stop()
  for n in pairs(self.isolated or {}) do self:heal(n) end
  for _, n in ipairs(self.nodes) do n:stop() end
end

--- Starts n (5) independent redis-servers for Redlock, each persisting every
-- write (appendonly, appendfsync always: a fence counter must survive a
-- restart). Returns the Servers, and their URLs as one comma-separated
-- text (for spec/workers/connect.lua's redlock:...). Raises when one
-- cannot start (stopping those that did).
function helpers.start_redlock(n)
  local servers, urls = {}, {}
  for i = 1, n or 5 do
    local ok, srv = pcall(helpers.start_redis, { "--appendonly", "yes", "--appendfsync", "always" })
    if not ok then
      for _, done in ipairs(servers) do done:stop() end
      error(srv)
    end
    servers[i], urls[i] = srv, srv.url
  end
  return servers, table.concat(urls, ",")
end

local Postgres = {}
Postgres.__index = Postgres

--- Starts a private PostgreSQL 15 server on a free loopback port, in a
-- folder of its own (initdb, trust authentication), run as the user
-- "nobody" (PostgreSQL refuses root); its socket is in the folder too.
-- Fields: port, user ("nobody"), db ("postgres"), dir. pg:psql(sql) runs
-- one statement and returns its output; pg:stop(). Raises when it cannot
-- start. Needs Debian's postgresql package.
function helpers.start_postgres()
  local bin = "/usr/lib/postgresql/15/bin/"
  local dir = (run("mktemp -d"):gsub("%s+$", ""))
  local pg = setmetatable({ port = helpers.free_port(), user = "nobody", db = "postgres", dir = dir }, Postgres)
  local as = "runuser -u nobody -- "
  local out, ok = run(table.concat({
    "chmod 755 " .. sh_quote(dir), "chown nobody " .. sh_quote(dir),
    as .. bin .. "initdb -A trust -U nobody -D " .. sh_quote(dir .. "/data") .. " >/dev/null",
    as .. bin .. "pg_ctl -w -t 30 -D " .. sh_quote(dir .. "/data") .. " -l " .. sh_quote(dir .. "/log")
      .. " -o " .. sh_quote("-p " .. pg.port .. " -k " .. dir .. " -c listen_addresses=127.0.0.1") .. " start"
      .. " >/dev/null",
  }, " && ") .. " 2>&1")
  if not ok then
    os.execute("rm -rf " .. sh_quote(dir))
    error("cannot start PostgreSQL: " .. out)
  end
  return pg
end

function Postgres:psql(sql)
  local out, ok = run("runuser -u nobody -- psql -X -q -t -A -h 127.0.0.1 -p " .. self.port
                      .. " -U nobody -d postgres -c " .. sh_quote(sql) .. " 2>&1")
  assert(ok, out)
  return (out:gsub("\n$", ""))
end

function Postgres:stop()
  run("runuser -u nobody -- /usr/lib/postgresql/15/bin/pg_ctl -m immediate -D " .. sh_quote(self.dir .. "/data")
      .. " stop >/dev/null 2>&1")
  os.execute("rm -rf " .. sh_quote(self.dir))
end

local Quiet = {}
Quiet.__index = Quiet

--- A master the group's first sentinel knows as "quiet" (a redis-server of
-- its own, watched with quorum 2, so never failed over), for a demotion no
-- +switch-master announces: quiet:demote() makes a second server the master
-- (the sentinel named it instead) and the first its replica, and closes the
-- first's client connections, as a restart would. Fields: old, new
-- (Servers), addr (the sentinel, for the client option). quiet:stop().
function Group:quiet_master()
  local q = setmetatable({ old = helpers.start_redis(), new = helpers.start_redis(), sentinel = self.sentinels[1],
                           addr = self.addrs[1] }, Quiet)
  local said = q.sentinel:cli("SENTINEL", "MONITOR", "quiet", "127.0.0.1", q.old.port, 2)
  if said ~= "OK" then
    q:stop()
    error("SENTINEL MONITOR said " .. said)
  end
  return q
end

function Quiet:demote()
  for _, step in ipairs({ { self.sentinel, "SENTINEL", "REMOVE", "quiet" },
                          { self.old, "REPLICAOF", "127.0.0.1", self.new.port },
                          { self.sentinel, "SENTINEL", "MONITOR", "quiet", "127.0.0.1", self.new.port, 2 } }) do
    local said = step[1]:cli((table.unpack or unpack)(step, 2)) -- luacheck: ignore (unpack: LuaJIT)
    assert(said == "OK", step[2] .. " said " .. said)
  end
  self.old:cli("CLIENT", "KILL", "TYPE", "normal")
end

function Quiet:stop()
  self.sentinel:cli("SENTINEL", "REMOVE", "quiet")
  self.old:stop()
  self.new:stop()
end

--- Stops every process of the group, by PID.
function Group:stop()
  for _, s in ipairs(self.extra or {}) do s:stop() end
  for _, s in ipairs(self.sentinels) do s:stop() end
  for _, n in ipairs(self.nodes) do n:stop() end
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

-- Replaces every literal "{{name}}" in s by vars[name]; other text, Lua's
-- `{{x}}` included, is left alone.
local function fill(s, vars)
  return (s:gsub("{{(%w+)}}", vars))
end

-- PIDs of a process's children (nginx's workers, for the master).
local function children(pid)
  local out = run("pgrep -P " .. pid)
  local pids = {}
  for p in out:gmatch("%d+") do pids[#pids + 1] = tonumber(p) end
  return pids
end

-- Quotes a path for nginx.conf.
local function ngx_quote(s)
  return '"' .. s:gsub('[\\"]', "\\%0") .. '"'
end

-- The nginx.conf for one instance: Debian's lua module, everything nginx writes
-- under the prefix, our Lua code and the LuaJIT build of the C core on the paths.
local function nginx_conf(prefix, vars, opts)
  local root = helpers.root()
  local cdir = os.getenv("REDISLOCK_NGX_CPATH_DIR") or (root .. "/build/luajit")
  local lines = {
    "# Written by spec/helpers.lua (start_nginx).",
    "load_module /usr/lib/nginx/modules/ndk_http_module.so;",
    "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;",
    -- As root the workers would run as nobody, who cannot enter the 0700
    -- prefix nor, maybe, the checkout.
    run("id -u"):match("^0%s") and "user root;" or "",
    "worker_processes " .. (opts.workers or 2) .. ";",
    "daemon on;",
    "master_process on;",
    "pid " .. ngx_quote(prefix .. "/nginx.pid") .. ";",
    "error_log " .. ngx_quote(prefix .. "/logs/error.log") .. " " .. (opts.log_level or "info") .. ";",
    fill(opts.main or "", vars),
    "events { worker_connections " .. (opts.worker_connections or 1024) .. "; }",
    "http {",
    "  access_log off;",
  }
  for _, kind in ipairs({ "client_body", "proxy", "fastcgi", "uwsgi", "scgi" }) do
    lines[#lines + 1] = "  " .. kind .. "_temp_path " .. ngx_quote(prefix .. "/temp/" .. kind) .. ";"
  end
  lines[#lines + 1] = "  lua_package_path " .. ngx_quote(root .. "/lua/?.lua;" .. root .. "/?.lua;;") .. ";"
  lines[#lines + 1] = "  lua_package_cpath " .. ngx_quote(cdir .. "/?.so;;") .. ";"
  lines[#lines + 1] = fill(opts.http or "", vars)
  lines[#lines + 1] = "}"
  return table.concat(lines, "\n") .. "\n"
end

local Nginx = {}
Nginx.__index = Nginx

--- Starts a private nginx with the lua module (daemon, by PID) on a free
-- loopback port. opts.http: config placed inside http { } after our defaults
-- (the server blocks); opts.main: more main-context lines (e.g. `env REDIS_URL;`);
-- in both, {{port}}, {{port2}} (a second free port), {{root}} (the checkout) and
-- {{prefix}} are replaced. opts.workers (2), opts.worker_connections (1024),
-- opts.log_level ("info"). Returns an object with port, port2, prefix, pid and
-- :stop(), :error_log(), :url(path), :workers(); raises when nginx cannot start.
function helpers.start_nginx(opts)
  opts = opts or {}
  local failure = ""
  for _ = 1, 5 do
    local prefix = tmpdir()
    local vars = { port = tostring(helpers.free_port()), port2 = tostring(helpers.free_port()),
                   root = helpers.root(), prefix = prefix }
    run("mkdir -p " .. sh_quote(prefix .. "/conf") .. " " .. sh_quote(prefix .. "/logs") .. " "
        .. sh_quote(prefix .. "/temp"))
    local conf = prefix .. "/conf/nginx.conf"
    local f = assert(io.open(conf, "w"))
    f:write(nginx_conf(prefix, vars, opts))
    f:close()
    -- Output to a file: a daemon holding popen's pipe would make run() wait.
    -- LUA_PATH/LUA_CPATH would leak into the lua module's ";;" (the suite's
    -- build folder may be the lua5.4 one).
    local out_file = prefix .. "/logs/nginx.out"
    local _, started = run("env -u LUA_PATH -u LUA_CPATH nginx -p " .. sh_quote(prefix .. "/")
                           .. " -c " .. sh_quote(conf) .. " > " .. sh_quote(out_file) .. " 2>&1")
    local port = tonumber(vars.port)
    local pid
    local up = started and helpers.eventually(5, function()
      pid = tonumber(read_file(prefix .. "/nginx.pid") or "")
      if not (pid and alive(pid)) then return false end
      local c = socket.tcp()
      c:settimeout(1)
      local ok = c:connect("127.0.0.1", port)
      c:close()
      return ok
    end)
    if up then
      return setmetatable({ port = port, port2 = tonumber(vars.port2), prefix = prefix, pid = pid }, Nginx)
    end
    local log = (read_file(out_file) or "") .. (read_file(prefix .. "/logs/error.log") or "")
    failure = "nginx output and error.log:\n" .. log .. "\nnginx.conf:\n" .. (read_file(conf) or "")
    setmetatable({ prefix = prefix, pid = pid }, Nginx):stop()
    if not log:find("Address already in use", 1, true) then break end
  end
  error("cannot start nginx; " .. failure)
end

--- Stops nginx: SIGQUIT (graceful, waits for requests in flight), then SIGTERM,
-- then SIGKILL for the master and its workers; removes the prefix. Idempotent.
function Nginx:stop()
  if self.pid then
    for _, sig in ipairs({ "QUIT", "TERM" }) do
      if alive(self.pid) then
        os.execute("kill -" .. sig .. " " .. self.pid .. " 2>/dev/null")
        helpers.eventually(sig == "QUIT" and 5 or 2, function() return not alive(self.pid) end)
      end
    end
    if alive(self.pid) then
      -- A master killed outright leaves its workers running, orphaned.
      local workers = children(self.pid)
      os.execute("kill -9 " .. self.pid .. " 2>/dev/null")
      for _, w in ipairs(workers) do os.execute("kill -9 " .. w .. " 2>/dev/null") end
    end
    self.pid = nil
  end
  if self.prefix then
    os.execute("rm -rf " .. sh_quote(self.prefix))
    self.prefix = nil
  end
end

--- The text of logs/error.log so far ("" once stopped).
function Nginx:error_log()
  return self.prefix and read_file(self.prefix .. "/logs/error.log") or ""
end

--- The URL of path on this nginx (path starts with "/").
function Nginx:url(path)
  return "http://127.0.0.1:" .. self.port .. (path or "/")
end

--- The worker processes' PIDs right now.
function Nginx:workers()
  return self.pid and children(self.pid) or {}
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
