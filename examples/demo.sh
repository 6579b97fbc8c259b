#!/bin/sh
# SPDX-License-Identifier: MIT
# `make demo`: examples/oversell.lua against a private, throwaway redis-server
# (tools/with-redis.sh starts it and stops it by PID). Exit status is the
# example's. Run from anywhere: sh examples/demo.sh
cd "$(dirname "$0")/.." || exit 2
exec sh tools/with-redis.sh sh -c '
  echo "redislock demo: selling stock from several processes, on a private redis-server at 127.0.0.1:$REDIS_PORT"
  exec lua5.4 examples/oversell.lua'
