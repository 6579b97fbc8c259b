-- SPDX-License-Identifier: MIT
rockspec_format = "3.0"
package = "redislock"
version = "0.1.0-1"
-- The release tagged v0.1.0. `make rock` packs this rockspec with that
-- archive (git archive of the tagged tree) into a source rock, so that
-- `luarocks install redislock-0.1.0-1.src.rock` needs no network.
source = {
  url = "https://github.com/redislock/redislock/archive/v0.1.0.tar.gz",
  dir = "redislock-0.1.0",
}
description = {
  summary = "Distributed locks on Redis for Lua and OpenResty, with fencing tokens",
  detailed = [[
    with_lock(key, ttl, fn) runs fn while holding a Redis lock and releases it
    even when fn raises. Atomic acquire with TTL, owner-checked release and
    extend, fencing tokens, waiting with backoff, TLS (rediss://, verified
    by default). Semaphores, read-write locks and multi-key locks; Sentinel,
    Redis Cluster and Redlock. A C core on hiredis' protocol code and OpenSSL.
    Built and tested with Lua 5.4 and LuaJIT 2.1 (OpenResty); PUC Lua 5.1 to
    5.3 are neither built nor tested (LuaJIT needs the "lua >= 5.1" below).
  ]],
  license = "MIT",
  labels = { "redis", "lock", "mutex", "distributed" },
}
-- LuaJIT reports itself as Lua 5.1, so 5.1 must be admitted here; what is
-- supported is Lua 5.4 and LuaJIT (see the description and the README).
dependencies = {
  "lua >= 5.1",
}
external_dependencies = {
  HIREDIS = { header = "hiredis/hiredis.h", library = "hiredis" },
  OPENSSL = { header = "openssl/ssl.h", library = "ssl" },
}
build = {
  type = "builtin",
  modules = {
    ["redislock.core"] = {
      sources = { "csrc/rl_proto.c", "csrc/rl_call.c", "csrc/rl_script.c", "csrc/rl_scripts.c", "csrc/rl_slot.c", "csrc/rl_sys.c", "csrc/rl_sha1.c",
                  "csrc/rl_tls.c", "csrc/rl_conn.c", "csrc/rl_many.c", "csrc/rl_renewal.c", "csrc/rl_watchdog.c", "csrc/rl_sentinel.c",
                  "csrc/rl_proc.c", "csrc/rl_lua.c", "csrc/rl_lua_call.c", "csrc/rl_lua_client.c", "csrc/rl_lua_lease.c",
                  "csrc/rl_lua_reader.c", "csrc/rl_lua_renewal.c", "csrc/rl_lua_watch.c" },
      libraries = { "hiredis", "ssl", "crypto", "pthread", "dl" },
      incdirs = { "$(HIREDIS_INCDIR)", "$(OPENSSL_INCDIR)" },
      libdirs = { "$(HIREDIS_LIBDIR)", "$(OPENSSL_LIBDIR)" },
    },
    redislock = "lua/redislock.lua",
    ["redislock.admin"] = "lua/redislock/admin.lua",
    ["redislock.args"] = "lua/redislock/args.lua",
    ["redislock.backoff"] = "lua/redislock/backoff.lua",
    ["redislock.client"] = "lua/redislock/client.lua",
    ["redislock.client_args"] = "lua/redislock/client_args.lua",
    ["redislock.lock"] = "lua/redislock/lock.lua",
    ["redislock.lease"] = "lua/redislock/lease.lua",
    ["redislock.metrics"] = "lua/redislock/metrics.lua",
    ["redislock.metrics_count"] = "lua/redislock/metrics_count.lua",
    ["redislock.metrics_text"] = "lua/redislock/metrics_text.lua",
    ["redislock.election"] = "lua/redislock/election.lua",
    ["redislock.election_io"] = "lua/redislock/election_io.lua",
    ["redislock.errors"] = "lua/redislock/errors.lua",
    ["redislock.guard"] = "lua/redislock/guard.lua",
    ["redislock.hold"] = "lua/redislock/hold.lua",
    ["redislock.sql"] = "lua/redislock/sql.lua",
    ["redislock.leadership"] = "lua/redislock/leadership.lua",
    ["redislock.multilock"] = "lua/redislock/multilock.lua",
    ["redislock.ngx"] = "lua/redislock/ngx.lua",
    ["redislock.ngx_conn"] = "lua/redislock/ngx_conn.lua",
    ["redislock.ngx_every"] = "lua/redislock/ngx_every.lua",
    ["redislock.ngx_gate"] = "lua/redislock/ngx_gate.lua",
    ["redislock.ngx_lease"] = "lua/redislock/ngx_lease.lua",
    ["redislock.ngx_watch"] = "lua/redislock/ngx_watch.lua",
    ["redislock.observe"] = "lua/redislock/observe.lua",
    ["redislock.scope"] = "lua/redislock/scope.lua",
    ["redislock.sentinel"] = "lua/redislock/sentinel.lua",
    ["redislock.cluster"] = "lua/redislock/cluster.lua",
    ["redislock.redlock"] = "lua/redislock/redlock.lua",
    ["redislock.resty_lock"] = "lua/redislock/resty_lock.lua",
    ["redislock.rwlock"] = "lua/redislock/rwlock.lua",
    ["redislock.semaphore"] = "lua/redislock/semaphore.lua",
    ["redislock.topology"] = "lua/redislock/topology.lua",
    ["redislock.tls"] = "lua/redislock/tls.lua",
    ["redislock.transport"] = "lua/redislock/transport.lua",
    ["redislock.url"] = "lua/redislock/url.lua",
    ["redislock.wait"] = "lua/redislock/wait.lua",
  },
  -- The command for cron and job dedup (docs/command.md).
  install = {
    bin = { redislock = "bin/redislock" },
  },
  -- The documentation pages and the command's manual page (redislock.1) go
  -- into the rock's own folder: `luarocks doc redislock` opens them, and
  -- `man -l "$(luarocks show --rock-dir redislock)/docs/redislock.1"` reads
  -- the manual (make install also puts it in share/man/man1).
  copy_directories = { "docs" },
}
test = {
  type = "command",
  command = "make test",
}
