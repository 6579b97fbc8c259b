#!/bin/sh
# SPDX-License-Identifier: MIT
# `make bench`: bench/cycle.lua under Lua 5.4 and LuaJIT against one private
# redis-server pinned to core 0, with the client (and its redis-benchmark floor)
# pinned first to another core, then to the same core: on a small machine the
# two placements differ by several times, so each figure is a ratio to a floor
# taken in the same run and placement.
cd "$(dirname "$0")/.." || exit 2
exec sh tools/with-redis.sh sh -c '
  set -e
  echo "redislock bench: private redis-server at 127.0.0.1:$REDIS_PORT, $(nproc) cores"
  taskset -apc 0 "$(cat "$REDIS_DIR/redis.pid")" >/dev/null
  last=$(($(nproc) - 1))
  for placement in "different cores:$last" "same core:0"; do
    cpu=${placement##*:}
    echo
    echo "== server on core 0, client on core $cpu (${placement%%:*})"
    taskset -c "$cpu" lua5.4 bench/cycle.lua
    echo
    LUA_CPATH="$PWD/build/luajit/?.so;;" taskset -c "$cpu" luajit bench/cycle.lua
  done'
