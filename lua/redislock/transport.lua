-- SPDX-License-Identifier: MIT
--- redislock.transport: how redislock reaches one Redis server (a node).
-- `node` picks the transport: the C core's (sockets of its own, blocking,
-- TLS through OpenSSL; the watchdog thread renews) in plain Lua, or redislock.ngx's (cosockets, nginx's pool;
-- the worker's timer renews) under OpenResty. Everything above (locks,
-- waiting, with_lock, and the topologies to come) talks to a node only
-- through this interface, which both transports implement:
--
--   t:eval(op, key, token[, ms[, more]])  one script (of the lock, a
--        semaphore or a read-write lock; more: { n = sem_acquire's limit, or
--        the TTL a handoff gives (ms) of acquire_wait and acquire_fair,
--        replicas = WAIT for this many after a success, replica_ms = ... this
--        long }) -> status, value[, acked | nil, err] | nil, "connection: ..." / "redis: ..."[, left]
--        (left, a failed take's: "nothing" when its call gave back the lock it
--        took, "staying" when it could not; a topology passes it on)
--   t:wait(key, token, ms[, op]) block on a wake-up list (op: whose; the lock's
--                                by default; token: a registered waiter's own)
--                                -> what woke it (a handoff: "<fence> <age>
--                                <at>") | false | nil, err
--   t:command(name, ...)         one plain command -> reply | nil, err
--   t:script(op, keys, ...)      one script sent with its caller's arguments
--        (op: "multi_acquire", "inspect", "force_release", "fenced_write",
--        "owned_write", "elect_observe", "elect_announce", "elect_proclaim",
--        or a guard's script { text =, sha = } from core.guard_script; keys:
--        a lock's key, an array of them for multi_acquire, or the names
--        themselves for the writes and a guard's; the script's names are
--        the C core's, csrc/scripts/) -> its reply | nil, err; EVAL after
--        NOSCRIPT, as eval's
--   t:lease(key, token, ttl_ms[, opts]) -> a node lease, renewed on this
--        node (the watchdog thread, or the worker's timer): its interface
--        and opts are redislock/lease.lua's, which composes them
--   t:lease_nodes(key, token)    a topology's, in place of lease: the node
--        transports a lock's lease renews on, how many must hold it, the
--        drift(ms) to take off its expiry, and the transport renewals go
--        through (redislock/lease.lua)
--   t:close(), t:closed()
--   t:io_problem()               nil, or the nginx phase that forbids I/O now
--   t.spread                     true when keys live on several servers (a
--                                cluster, Redlock): no script sees them all
--   t.last_role                  under OpenResty, behind Sentinel (master_only):
--                                the role a new connection's ROLE said, kept
--                                beside a refusal of class "demoted"
--   t:retarget(host, port)       point it, and the leases renewed on it, at another
--                                TCP node (Sentinel's new master)
--   t:usable()                   false when its next call opens a new connection
--                                (redislock/sentinel.lua asks the sentinels first)
--   t:eval_until(deadline, op, key, token[, ms])  optional (Redlock): a release or
--        extend that asks servers refusing it for a passing state (LOADING ...)
--        again until deadline; redislock/backoff.lua's again uses it when present
--
-- and, for redislock/sentinel.lua, one of each: the C core's
-- core.sentinel_watch, or the cosockets' t:listen(channel, heard, stop)
-- under redislock/ngx_watch.lua.
--
-- The topologies over several nodes (redislock/sentinel.lua, cluster.lua,
-- redlock.lua) are written once against this module, and never ask which
-- runtime they run in; what differs is supplied here (see each, watch,
-- waiting, check_names below): in plain Lua by the C core, under
-- OpenResty by redislock/ngx.lua's runtime table.

local args = require("redislock.args")
local core = require("redislock.core")
local tls = require("redislock.tls")

local rawget, type = rawget, type
local unpack = table.unpack or unpack -- luacheck: ignore (LuaJIT's global)

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

-- Under ngx_lua (OpenResty) Redis I/O goes over cosockets: redislock/ngx.lua.
local ngx = rawget(_G, "ngx")
local ngx_transport = type(ngx) == "table" and type(ngx.socket) == "table" and ngx.get_phase
  and require("redislock.ngx")

--- The caller's context, for messages: under OpenResty its request (or
-- timer), which locks of one worker's client tell apart; nil in plain Lua.
_M.context = ngx_transport and require("resty.core.base").get_request or function() return nil end
-- Whether there are contexts (OpenResty): context() is always nil when not.
_M.contexts = ngx_transport and true or false

--- A transport for one node, and the sleep that goes with it (ngx.sleep or
-- core.sleep). No I/O. fields: host, port, path, username, password, db,
-- connect_timeout_ms, timeout_ms, prefix, tls (redislock/tls.lua's
-- settings, or nil), and (OpenResty only; dropped in
-- plain Lua, where a client has one connection) pool_size,
-- wait_connections, keepalive_timeout_ms; all checked by the caller.
function _M.node(fields)
  if ngx_transport then return ngx_transport.new(fields), ngx.sleep end
  fields.pool_size, fields.keepalive_timeout_ms, fields.wait_connections = nil, nil, nil
  return tls.core_new(fields), core.sleep
end

-- Plain Lua's runtime: the C core's calls to several connections at once
-- (one poll() over all the sockets), and the Sentinel watch thread.
local c_runtime = {
  each = function(nodes, timeout_ms, op, key, tok, ms)
    return core.eval_many(timeout_ms, op, key, tok, ms, unpack(nodes))
  end,
  watch = function(master, sentinels) return core.sentinel_watch(master, unpack(sentinels)) end,
  check_names = function() end,
}
local runtime = ngx_transport and ngx_transport.runtime or c_runtime

--- each(nodes, timeout_ms, op, key, token, ms) -> statuses, values: runs
-- the lock script op on every node transport of nodes at once, each
-- bounded by timeout_ms: per node, the status (1, 0, -1) and value, or
-- false and an error message.
_M.each = runtime.each

--- watch(master, sentinels, client) -> watch | nil, err: what hears that
-- the sentinels switched master (watch:count() grows on every switch, and
-- subscription lost or made; watch:heard() -> host, port: the master the
-- last switch announced, while nothing else was counted since;
-- watch:close(client)); sentinels: their transports.
_M.watch = runtime.watch

--- waiting() -> a waiting strategy | nil: what the runtime adds to a
-- client's waiting (redislock/wait.lua's take): under OpenResty the gates
-- where the waiting requests of one nginx worker queue, so that one of
-- them waits on Redis for all (redislock/ngx_gate.lua); none in plain Lua,
-- where the calls on a client block the process one at a time.
_M.waiting = runtime.waiting

--- check_names(tls, message[, host]): raises message, a bad argument to
-- 'new', when nodes named by address (the topology's, or host when it is
-- an address) would be verified with tls settings that have no
-- server_name under OpenResty, whose handshake checks DNS names only.
-- Nothing to check in plain Lua.
_M.check_names = runtime.check_names

return _M
