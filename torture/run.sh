#!/bin/sh
# SPDX-License-Identifier: MIT
# make torture: runs torture/run.lua with the checkout's modules, keeping the
# servers and logs it makes under one temporary folder. However the run ends,
# any server still running there is stopped (by PID); the folder is removed,
# except after a failing run, whose logs it keeps (and names).
set -u
cd "$(dirname "$0")/.." || exit 2
root=$(pwd)
tmp=$(mktemp -d)
keep=""
cleanup() {
  for pidfile in "$tmp"/*/*.pid; do
    [ -f "$pidfile" ] && kill -CONT "$(cat "$pidfile")" 2>/dev/null && kill "$(cat "$pidfile")" 2>/dev/null
  done
  if [ -n "$keep" ]; then echo "torture: the logs are in $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# As root, the run is in a network namespace of its own (tools/netns.sh),
# where the Sentinel and Redlock phases put each server on an address of
# its own and cut them apart with iptables; the rules go with the
# namespace, whatever happens to the run.
. tools/netns.sh
isolated env REDISLOCK_TEST_TMP="$tmp" REDISLOCK_NETNS="$netns" LUA_PATH="$root/lua/?.lua;$root/?.lua;;" \
  LUA_CPATH="$root/build/lua5.4/?.so;;" lua5.4 torture/run.lua
status=$?
[ $status = 1 ] && keep=1
exit $status
