#!/bin/sh
# SPDX-License-Identifier: MIT
# `make bench` (benchmarks, not tests): every figure beside a baseline taken in
# the same run, against one private redis-server pinned to core 0:
#   bench/cycle.lua    acquire+release and with_lock vs the raw floor
#                      (bench/floor.c) and redis-benchmark -c 1, Lua 5.4 and
#                      LuaJIT, the client on another core, then on core 0 too
#   bench/split.lua    where a cycle's time goes: the minimal lock, the
#                      library's bytes raw, over the library's socket, from
#                      LuaJIT's FFI, then the library (rates and server CPU)
#   bench/tls.lua      acquire+release over TLS vs plaintext, and new
#                      connections (a handshake each), on a server of its own
#   bench/cluster.lua  acquire+release through cluster routing vs a
#                      single-server client, on a one-node cluster of its own
#   bench/metrics.lua  acquire+release with metrics on vs off (redislock.metrics),
#                      finely interleaved, Lua 5.4 and LuaJIT, both placements
#   bench/primitives.lua  a semaphore permit's, a read/write hold's and a
#                      2-key lock's cycle vs the lock's, same run
#   bench/guard.lua    a SET through lock:fenced() and lock:owned() vs the
#                      plain SET, and in round trips (PINGs) beyond it
#   bench/redlock.lua  Redlock over five servers of its own vs one of them,
#                      and vs node-redlock (npm, into a temporary folder)
#   bench/handoff.lua  release-to-next-holder latency per waiting mode vs a PING
#   bench/contend.lua  2, 8, 32 processes on one key: acquisitions/s, violations
#   bench/stampede.lua examples/openresty's cache-stampede guard, 3,000 requests
#                      at once on 2 nginx workers: slowest answer, failures,
#                      peak Redis connections, coalesced or not, vs a
#                      shared-dict lock; and against maxclients 64
#   bench/callgrind.sh the client's instructions per acquire+release and per command (Lua 5.4, LuaJIT)
#   bench/syscalls.sh  the client's system calls per acquire+release (strace; Lua 5.4, LuaJIT)
#   bench/ngx_counts.lua an nginx worker's system calls (strace) and instructions
#                      (callgrind) per acquire+release, beside lua-resty-redis's
#   bench/memory.lua   client RSS before and after 10^6 cycles
#   bench/peers.lua    redis-py's Lock, lua-resty-redis in nginx (nginx and the
#                      client on another core, then on core 0 too)
# Each script prints `bench name=... value=...` lines; bench/report.lua turns
# them into a table, then repeats them for machines. Progress goes to stderr.
# Knobs (environment): BENCH_CYCLES (4000 per slice), BENCH_SLICES (15), BENCH_SPLIT_ROUNDS (9),
# BENCH_PEER_SLICES (9), BENCH_HANDOFF_ROUNDS (300), BENCH_HANDOFF_PY_ROUNDS (100), BENCH_HOLD_MS (15),
# BENCH_CONTEND_PROCS ("2 8 32"), BENCH_CONTEND_SECONDS (2), BENCH_CONTEND_FLOOR (1: the C floor, when built),
# BENCH_STAMPEDE (3000), BENCH_STAMPEDE_CAPPED (1000), BENCH_STAMPEDE_MAXCLIENTS (64), BENCH_STAMPEDE_ROUNDS (3),
# BENCH_MEMORY_CYCLES (1000000), BENCH_SERVER_CPU (0, for tls.lua), BENCH_ONLY (a list of the script names above,
# without .lua, to run only those).
cd "$(dirname "$0")/.." || exit 2
if [ -z "${REDIS_PORT:-}" ]; then
  exec sh tools/with-redis.sh sh bench/run.sh "$@"
fi

set -u
BENCH_ROOT=$PWD
LUA_PATH="$PWD/bench/?.lua;$LUA_PATH"
LUA_PATH_5_4=$LUA_PATH
export BENCH_ROOT LUA_PATH LUA_PATH_5_4
JIT_CPATH="$PWD/build/luajit/?.so;;"
results="$REDIS_DIR/results"
: > "$results"
status=0
started=$(date +%s)

# step NAME DESCRIPTION COMMAND...: runs one benchmark script, its results into
# $results; a failure is reported and the run goes on.
step() {
  step_name=$1 step_what=$2
  shift 2
  case " ${BENCH_ONLY:-$step_name} " in *" $step_name "*) ;; *) return 0 ;; esac
  echo "bench: $step_what" >&2
  if ! "$@" >> "$results"; then
    echo "bench: FAILED: $step_what" >&2
    echo "FAILED: $step_what" >> "$results"
    status=1
  fi
}

taskset -apc 0 "$(cat "$REDIS_DIR/redis.pid")" >/dev/null
last=$(($(nproc) - 1))
{
  echo "redislock bench, $(date -u '+%Y-%m-%d %H:%M UTC'): $(nproc) cores ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)), $(uname -sr)"
  echo "redis-server $(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p') at 127.0.0.1:$REDIS_PORT, pinned to core 0; clients on core $last (different cores) or core 0 (same core)"
} >> "$results"

# placed SCRIPT DESCRIPTION: one step of bench/SCRIPT.lua for each interpreter,
# the client on another core than the server's, then on the server's.
placed() {
  for placement in "different-cores:$last" "same-core:0"; do
    where=${placement%%:*} cpu=${placement##*:}
    step "$1" "$2, Lua 5.4, $where" taskset -c "$cpu" lua5.4 "bench/$1.lua" "$where"
    step "$1" "$2, LuaJIT, $where" env LUA_CPATH="$JIT_CPATH" taskset -c "$cpu" luajit "bench/$1.lua" "$where"
  done
}
placed cycle "cycle"
# Where a cycle's time goes: the clients in processes of their own, each
# placement once (the driver's interpreter does not matter).
for placement in "different-cores:$last" "same-core:0"; do
  step split "where a cycle's time goes, ${placement%%:*}" taskset -c "${placement##*:}" lua5.4 bench/split.lua "${placement%%:*}"
done
placed tls "TLS vs plaintext"
placed cluster "cluster routing"
placed metrics "metrics on vs off"
placed primitives "semaphore, rwlock, multi-key vs the lock"
placed guard "guarded writes vs the plain write"
# Redlock: five servers of its own and the client, wherever the scheduler puts them.
step redlock "Redlock over 5 servers (and node-redlock), Lua 5.4" lua5.4 bench/redlock.lua
step redlock "Redlock over 5 servers (and node-redlock), LuaJIT" env LUA_CPATH="$JIT_CPATH" luajit bench/redlock.lua
# Handoff: the holder beside the server, the waiter and the PINGs on another
# core. Contention: the processes go wherever the scheduler puts them.
BENCH_SERVER_CPU=0 BENCH_CLIENT_CPU=$last
export BENCH_SERVER_CPU BENCH_CLIENT_CPU
step handoff "handoff latency" taskset -c "$last" lua5.4 bench/handoff.lua
step contend "contended throughput" lua5.4 bench/contend.lua
step stampede "OpenResty stampede: waiters coalesced, connections bounded" lua5.4 bench/stampede.lua
step callgrind "client instructions per cycle, per with_lock and per command (callgrind), Lua 5.4 and LuaJIT" sh bench/callgrind.sh
step syscalls "client system calls per cycle (strace), Lua 5.4 and LuaJIT" sh bench/syscalls.sh
step ngx_counts "an nginx worker's system calls and instructions per cycle, beside lua-resty-redis" lua5.4 bench/ngx_counts.lua
step memory "memory, Lua 5.4" taskset -c 0 lua5.4 bench/memory.lua same-core
step memory "memory, LuaJIT" env LUA_CPATH="$JIT_CPATH" taskset -c 0 luajit bench/memory.lua same-core
step peers "peers: redis-py, lua-resty-redis in nginx, different cores" taskset -c "$last" lua5.4 bench/peers.lua different-cores
step peers "peers: redis-py, lua-resty-redis in nginx, same core" taskset -c 0 lua5.4 bench/peers.lua same-core

echo "total time: $(($(date +%s) - started)) s" >> "$results"
echo >&2
lua5.4 bench/report.lua "$results" || status=1
exit $status
