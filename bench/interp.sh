# SPDX-License-Identifier: MIT
# Sourced by bench/callgrind.sh and bench/syscalls.sh (from the checkout's
# root), which count what a process of each interpreter does: a client that
# takes and releases locks, under a tool that counts (loop_under).

# Against a private redis-server (tools/with-redis.sh starts it and stops it
# by PID) unless REDIS_PORT names one: the script runs again under it.
if [ -z "${REDIS_PORT:-}" ]; then
  exec sh tools/with-redis.sh sh "bench/${0##*/}" "$@"
fi
set -u

# in_checkout LUA CMD...: runs CMD with the Lua paths set to this checkout's
# lua/ and build/LUA/ (LUA: lua5.4 or luajit).
in_checkout() {
  checkout_lua=$1
  shift
  LUA_PATH="$PWD/lua/?.lua;;" LUA_PATH_5_4="$PWD/lua/?.lua;;" \
    LUA_CPATH="$PWD/build/$checkout_lua/?.so;;" LUA_CPATH_5_4="$PWD/build/$checkout_lua/?.so;;" "$@"
}

# interpreter LUA: sets suffix ("" or "/luajit", for figure names) and name
# ("Lua 5.4", "LuaJIT"); exits 2 when LUA is unknown or not installed.
interpreter() {
  case $1 in
  lua5.4) suffix="" name="Lua 5.4" ;;
  luajit) suffix="/luajit" name="LuaJIT" ;;
  *) echo "bench: unknown interpreter $1 (lua5.4, luajit)" >&2; exit 2 ;;
  esac
  command -v "$1" >/dev/null || { echo "bench: $1 not found" >&2; exit 2; }
}

# loop_under LUA N OPTS BODY TOOL...: runs, under TOOL..., a process of
# interpreter LUA that makes a client of the server at REDIS_PORT (OPTS: more
# fields of its options, each after a comma, or "") and runs BODY (Lua, with
# the client c) N times; its output goes nowhere, its status is TOOL's.
loop_under() {
  loop_lua=$1 loop_n=$2 loop_opts=$3 loop_body=$4
  shift 4
  in_checkout "$loop_lua" "$@" "$loop_lua" - "$REDIS_PORT" "$loop_n" <<EOF_LOOP >/dev/null 2>&1
local c = require("redislock").new({ port = tonumber(arg[1])$loop_opts })
for _ = 1, tonumber(arg[2]) do $loop_body end
c:close()
EOF_LOOP
}
