#!/bin/sh
# SPDX-License-Identifier: MIT
# `make bench`: bench/cycle.lua under Lua 5.4 and LuaJIT, against one private
# redis-server. Figures are ratios to a floor measured in the same run.
cd "$(dirname "$0")/.." || exit 2
exec sh tools/with-redis.sh sh -c '
  echo "redislock bench: private redis-server at 127.0.0.1:$REDIS_PORT, $(nproc) cores"
  lua5.4 bench/cycle.lua || exit 1
  echo
  LUA_CPATH="$PWD/build/luajit/?.so;;" luajit bench/cycle.lua'
