-- SPDX-License-Identifier: MIT
-- One torture section, shared by the plain workers (torture/worker.lua) and
-- the OpenResty ones (torture/ngx_app.lua): what a section is, how it is
-- picked, and the log lines it leaves (on the monotonic clock every process
-- shares):
--   E <now> <key> <fence> <mode> <node> <sent> <token>
--                                        node: the port of the master the
--                                        client used (Sentinel, Cluster), else "-";
--                                        sent: when the try that took the
--                                        lock was sent (its grant came later);
--                                        token: the lock's (a lock handed
--                                        down within an nginx worker keeps
--                                        its token and fence)
--   X <now> <key> <fence> <outcome>     outcome: ok, or the code of why the
--                                        guarded write was not done: stale (the
--                                        register refused the fence: a newer
--                                        holder wrote), lost (known lost here:
--                                        not sent), connection ...
--   L <now> <key> <code> <message>      with_lock raised after fn ran
--   F <now> <key> <code> <waited> <wait> <message>   it failed before fn ran
-- Inside, a read-modify-write of the key's counter and a fenced write
-- (lock:fenced(register), redislock/guard.lua), both on the register (never
-- faulted); entry and exit also go to the register's
-- list history:<key> ("in|out <id> <fence>"), its own order, for
-- a check that needs no clock.
local core = require("redislock.core")

local _M = {}

local MODES = { "notify", "poll", "fair" }

--- The options of a lock client for where (the workers' lock argument):
-- "<port>" for one server on 127.0.0.1, or "<host>:<port>" (with tls_ca:
-- TLS, verified as localhost; tls_ca true: nginx's trusted certificate), or
-- "sentinel=<host:port>,...@<master name>", "cluster=<host:port>,...", or
-- "redlock=<url>,...".
function _M.client_opts(where, tls_ca)
  local opts = { timeout = 0.5, connect_timeout = 0.5 }
  local urls = where:match("^redlock=(.+)$")
  if urls then
    opts.redlock, opts.timeout = {}, nil -- Redlock's own bound per server
    for u in urls:gmatch("[^,]+") do opts.redlock[#opts.redlock + 1] = u end
    return opts
  end
  local list, name = where:match("^sentinel=(.-)@(.+)$")
  if list then
    opts.sentinels, opts.master = {}, name
    for addr in list:gmatch("[^,]+") do opts.sentinels[#opts.sentinels + 1] = addr end
    return opts
  end
  local seeds = where:match("^cluster=(.+)$")
  if seeds then
    opts.cluster = {}
    for addr in seeds:gmatch("[^,]+") do opts.cluster[#opts.cluster + 1] = addr end
    return opts
  end
  local host, port = where:match("^([%d.]+):(%d+)$")
  opts.host, opts.port = host or "127.0.0.1", assert(tonumber(port or where), "a lock port, host:port, sentinel=... "
                                                     .. "cluster=... or redlock=...: " .. where)
  if tls_ca then
    opts.tls = tls_ca == true and { server_name = "localhost" } or { ca = tls_ca, server_name = "localhost" }
  end
  return opts
end

--- The next section's parameters, from math.random: { key, mode, hold, wait }.
-- One section in 100 outlasts the TTL (1.5 to 3 TTLs): renewal keeps it. (One
-- in five left the keys held most of the time, and the workers waiting.)
-- where: the lock argument (Redlock has no fair mode: no one queue).
function _M.pick(nkeys, ttl, where)
  return {
    key = "k" .. math.random(nkeys),
    mode = MODES[math.random(where:match("^redlock=") and 2 or #MODES)],
    hold = math.random(100) == 1 and ttl * (1.5 + 1.5 * math.random()) or 0.002 * math.random(10),
    wait = 0.5 + 2 * math.random(),
  }
end

--- Runs section s ({ key, mode, hold, wait }) as worker id: with_lock(client,
-- key, ttl, fn, opts) takes the lock (client:with_lock, or a stand-in),
-- register is a redislock client of the register, sleep sleeps, log(line)
-- appends.
function _M.run(s, id, ttl, with_lock, client, register, sleep, log)
  local key, started, entered = s.key, core.now(), false
  local ok, err = pcall(with_lock, client, key, ttl, function(lock)
    entered = true
    -- Which master granted it: the Sentinel or cluster client's own
    -- (internal) field, read before anything yields (OpenResty's watch may
    -- move it, another request's script may change it).
    local node = type(lock._t) == "table" and rawget(lock._t, "_port") or "-"
    local event = id .. " " .. lock.fence
    register:command("RPUSH", "history:" .. key, "in " .. event)
    log(string.format("E %.6f %s %d %s %s %.6f %s\n", core.now(), key, lock.fence, s.mode, tostring(node),
                      rawget(lock, "_since") or started, lock.token))
    local n = tonumber(register:command("GET", "count:" .. key)) or 0
    sleep(s.hold)
    register:command("SET", "count:" .. key, n + 1)
    -- The resource: one per key, across every fault (a server restarted
    -- without its data, a promoted replica, a master named again: their
    -- fences follow the clock, above every earlier one).
    local accepted, why = lock:fenced(register):set("resource:" .. key, event)
    register:command("RPUSH", "history:" .. key, "out " .. event)
    local outcome = accepted and "ok" or (tostring(why):match("^(%a+):") or "error")
    log(string.format("X %.6f %s %d %s\n", core.now(), key, lock.fence, outcome))
  end, { wait = s.wait, wait_mode = s.mode == "fair" and "notify" or s.mode, fair = s.mode == "fair" })
  if ok then return end
  local msg = tostring(err):gsub("\n", " ")
  local code = msg:match("^(%a+):") or "uncoded"
  if entered then
    log(string.format("L %.6f %s %s %s\n", core.now(), key, code, msg))
  else
    log(string.format("F %.6f %s %s %.3f %.3f %s\n", core.now(), key, code, core.now() - started, s.wait, msg))
  end
end

return _M
