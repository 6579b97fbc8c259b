#!/bin/sh
# SPDX-License-Identifier: MIT
# Benchmark (not a test): the client's instructions per acquire+release,
# per acquire+release through the C core's calls alone (bench/split_client.lua's
# core loop: what the Lua layer adds is the difference), per with_lock with
# an empty fn (its lock renewed while fn runs, as with_lock's are) and per
# client:command("GET", ...), under Lua 5.4 and LuaJIT, counted by valgrind's
# callgrind over 1,000 and then 3,000 of them against a private
# redis-server; the difference over 2,000 leaves out what runs once
# (loading, the first connection, tables made once, LuaJIT's compiling).
#   sh bench/callgrind.sh [lua5.4] [luajit]   (both by default; make first; needs valgrind)
# With BENCH_METRICS=1 the client counts its holds (redislock.metrics);
# the C core's calls alone are not counted then.
cd "$(dirname "$0")/.." || exit 2
. bench/interp.sh
command -v valgrind >/dev/null || { echo "bench: valgrind not found" >&2; exit 2; }
metrics= on=
[ "${BENCH_METRICS:-0}" = 1 ] && metrics=', metrics = require("redislock.metrics").new()' on=", metrics on"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# count LUA N BODY: the instructions of a process of interpreter LUA
# (lua5.4, luajit) that makes a client, then runs BODY (Lua, with the
# client c) N times.
count() {
  loop_under "$1" "$2" "$metrics" "$3" valgrind --tool=callgrind --callgrind-out-file="$out" ||
    { echo "bench: callgrind failed ($1)" >&2; exit 1; }
  awk '/^(summary|totals):/ { print $2; exit }' "$out"
}
# count_core LUA N: the same for bench/split_client.lua's loop of N cycles
# through the C core's calls alone (core.fast_take, core.fast_release).
count_core() {
  in_checkout "$1" valgrind --tool=callgrind --callgrind-out-file="$out" \
    "$1" bench/split_client.lua "$REDIS_PORT" "$2" core callgrind >/dev/null 2>&1 ||
    { echo "bench: callgrind failed ($1, core)" >&2; exit 1; }
  awk '/^(summary|totals):/ { print $2; exit }' "$out"
}
# emit LUA NAME UNIT LABEL BODY: one figure, 3,000 less 1,000 runs of BODY
# (BODY "core": split_client.lua's core loop).
emit() {
  if [ "$5" = core ]; then
    a=$(count_core "$1" 1000) b=$(count_core "$1" 3000)
  else
    a=$(count "$1" 1000 "$5") b=$(count "$1" 3000 "$5")
  fi
  [ -n "$a" ] && [ -n "$b" ] || exit 1
  echo "bench name=callgrind/$2 value=$(( (b - a) / 2000 )) unit=$3 note=\"callgrind, 3000 less 1000\" label=\"$4\""
}
[ $# -gt 0 ] || set -- lua5.4 luajit
for lua in "$@"; do
  interpreter "$lua"
  name=$name$on
  emit "$lua" "cycle$suffix" instructions/cycle "client instructions per acquire+release ($name)" \
    'assert(assert(c:acquire("callgrind", 10)):release())'
  [ -n "$metrics" ] || emit "$lua" "cycle.core$suffix" instructions/cycle \
    "client instructions per acquire+release, the C core's calls alone ($name)" core
  emit "$lua" "with_lock$suffix" instructions/cycle "client instructions per with_lock, empty fn ($name)" \
    'c:with_lock("callgrind", 10, function() end)'
  emit "$lua" "command$suffix" instructions/call "client instructions per client:command of a GET ($name)" \
    'assert(c:command("GET", "callgrind") ~= nil)'
done
