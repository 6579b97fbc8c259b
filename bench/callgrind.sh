#!/bin/sh
# SPDX-License-Identifier: MIT
# Benchmark (not a test): the client's instructions per acquire+release
# under Lua 5.4, counted by valgrind's callgrind over 1,000 and then 3,000
# cycles against a private redis-server; the difference over 2,000 leaves
# out what runs once (loading, the first connection, tables made once).
#   sh bench/callgrind.sh        (make first; needs valgrind)
cd "$(dirname "$0")/.." || exit 2
if [ -z "${REDIS_PORT:-}" ]; then
  exec sh tools/with-redis.sh sh bench/callgrind.sh "$@"
fi
set -u
command -v valgrind >/dev/null || { echo "bench: valgrind not found" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
loop='local c = require("redislock").new({ port = tonumber(arg[1]) })
for _ = 1, tonumber(arg[2]) do assert(assert(c:acquire("callgrind", 10)):release()) end
c:close()'
count() {
  LUA_PATH="$PWD/lua/?.lua;;" LUA_CPATH="$PWD/build/lua5.4/?.so;;" \
    valgrind --tool=callgrind --callgrind-out-file="$out" lua5.4 - "$REDIS_PORT" "$1" <<EOF_LOOP >/dev/null 2>&1 ||
$loop
EOF_LOOP
    { echo "bench: callgrind failed" >&2; exit 1; }
  awk '/^(summary|totals):/ { print $2; exit }' "$out"
}
a=$(count 1000)
b=$(count 3000)
[ -n "$a" ] && [ -n "$b" ] || exit 1
echo "bench name=callgrind/cycle value=$(( (b - a) / 2000 )) unit=instructions/cycle note=\"callgrind, 3000 less 1000 cycles\" label=\"client instructions per acquire+release (Lua 5.4)\""
