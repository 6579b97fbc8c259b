#!/bin/sh
# SPDX-License-Identifier: MIT
# Benchmark (not a test): the client's instructions per acquire+release,
# and per client:command("GET", ...), under Lua 5.4, counted by valgrind's
# callgrind over 1,000 and then 3,000 of them against a private
# redis-server; the difference over 2,000 leaves out what runs once
# (loading, the first connection, tables made once).
#   sh bench/callgrind.sh        (make first; needs valgrind)
# BENCH_LUA=luajit counts under LuaJIT (build/luajit) instead; with
# BENCH_METRICS=1 the client counts its holds (redislock.metrics).
cd "$(dirname "$0")/.." || exit 2
if [ -z "${REDIS_PORT:-}" ]; then
  exec sh tools/with-redis.sh sh bench/callgrind.sh "$@"
fi
set -u
command -v valgrind >/dev/null || { echo "bench: valgrind not found" >&2; exit 2; }
lua=${BENCH_LUA:-lua5.4}
case $lua in
  lua5.4) build=lua5.4 name="Lua 5.4" ;;
  luajit) build=luajit name=LuaJIT ;;
  *) echo "bench: BENCH_LUA must be lua5.4 or luajit" >&2; exit 2 ;;
esac
metrics=
[ "${BENCH_METRICS:-0}" = 1 ] && metrics=', metrics = require("redislock.metrics").new()' name="$name, metrics on"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# count N BODY: the instructions of a process that makes a client, then
# runs BODY (Lua, with the client c) N times.
count() {
  LUA_PATH="$PWD/lua/?.lua;;" LUA_CPATH="$PWD/build/$build/?.so;;" \
    valgrind --tool=callgrind --callgrind-out-file="$out" "$lua" - "$REDIS_PORT" "$1" <<EOF_LOOP >/dev/null 2>&1 ||
local c = require("redislock").new({ port = tonumber(arg[1])$metrics })
for _ = 1, tonumber(arg[2]) do $2 end
c:close()
EOF_LOOP
    { echo "bench: callgrind failed" >&2; exit 1; }
  awk '/^(summary|totals):/ { print $2; exit }' "$out"
}
# emit NAME UNIT LABEL BODY: one figure, 3,000 less 1,000 runs of BODY.
emit() {
  a=$(count 1000 "$4")
  b=$(count 3000 "$4")
  [ -n "$a" ] && [ -n "$b" ] || exit 1
  echo "bench name=callgrind/$1 value=$(( (b - a) / 2000 )) unit=$2 note=\"callgrind, 3000 less 1000\" label=\"$3\""
}
emit cycle instructions/cycle "client instructions per acquire+release ($name)" \
  'assert(assert(c:acquire("callgrind", 10)):release())'
emit command instructions/call "client instructions per client:command of a GET ($name)" \
  'assert(c:command("GET", "callgrind") ~= nil)'
