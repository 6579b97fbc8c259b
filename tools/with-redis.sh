#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs a command against a private, throwaway redis-server on a free loopback
# port, in a temporary folder:  sh tools/with-redis.sh COMMAND [ARGS...]
# The command runs from the repository root with REDIS_URL, REDIS_PORT and
# REDIS_DIR set, and with LUA_PATH/LUA_CPATH pointing at this checkout's Lua 5.4
# build. The server is stopped by its PID (never by name) however the command
# ends. Exit status is the command's. Used by `make demo` and `make bench`.
set -u
cd "$(dirname "$0")/.." || exit 2
[ $# -gt 0 ] || { echo "usage: sh tools/with-redis.sh COMMAND [ARGS...]" >&2; exit 2; }

for tool in lua5.4 redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "redislock: $tool not found (make deps)" >&2; exit 2; }
done

tmp=$(mktemp -d) || exit 2
pidfile="$tmp/redis.pid"

stop_server() {
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
    # Wait (up to 5 s) until it has shut down, so that it is not still writing
    # into $tmp. Redis deletes its pidfile as it exits; that is the signal to
    # wait for, as the process may linger as a zombie until init reaps it.
    n=0
    while [ -f "$pidfile" ] && kill -0 "$pid" 2>/dev/null && [ $n -lt 100 ]; do
      sleep 0.05
      n=$((n + 1))
    done
  fi
  rm -f "$pidfile"
}
# shellcheck disable=SC2317  # reached through the trap
cleanup() {
  stop_server
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free port: the kernel picks one (lua-socket); a random high one otherwise.
# Someone may take it before redis-server binds it, so a failed start is retried.
free_port() {
  lua5.4 -e 'local s = assert(require("socket").bind("127.0.0.1", 0))
             print((select(2, s:getsockname()))) s:close()' 2>/dev/null ||
    awk -v seed="$$$1" 'BEGIN { srand(seed); print 20000 + int(rand() * 40000) }'
}

port=""
for try in 1 2 3 4 5; do
  p=$(free_port "$try")
  n=0
  redis-server --bind 127.0.0.1 --port "$p" --save '' --appendonly no \
    --daemonize yes --pidfile "$pidfile" --logfile "$tmp/redis.log" --dir "$tmp" \
    >"$tmp/start.log" 2>&1 || n=100  # refused its arguments: no point waiting
  while [ $n -lt 100 ]; do
    # Our own log must say ready: a PONG alone could come from a server that
    # took the port first (then ours logs "Address already in use").
    grep -q "Address already in use" "$tmp/redis.log" 2>/dev/null && break
    if grep -q "Ready to accept connections" "$tmp/redis.log" 2>/dev/null &&
       [ "$(redis-cli -p "$p" ping 2>/dev/null)" = PONG ]; then
      port=$p
      break
    fi
    sleep 0.05
    n=$((n + 1))
  done
  [ -n "$port" ] && break
  stop_server
  : > "$tmp/redis.log"
done
if [ -z "$port" ]; then
  echo "redislock: cannot start redis-server; it says:" >&2
  cat "$tmp/start.log" "$tmp/redis.log" >&2
  exit 2
fi

# LUA_PATH_5_4 and LUA_CPATH_5_4 win over LUA_PATH and LUA_CPATH in Lua 5.4:
# set them too, so that this checkout's module is the one loaded.
LUA_PATH="$PWD/lua/?.lua;;"
LUA_CPATH="$PWD/build/lua5.4/?.so;;"
LUA_PATH_5_4=$LUA_PATH
LUA_CPATH_5_4=$LUA_CPATH
REDIS_URL="redis://127.0.0.1:$port"
REDIS_PORT=$port
REDIS_DIR=$tmp
export LUA_PATH LUA_CPATH LUA_PATH_5_4 LUA_CPATH_5_4 REDIS_URL REDIS_PORT REDIS_DIR

"$@"
