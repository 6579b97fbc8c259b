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
  pids=""
  for pidfile in "$tmp"/*/*.pid; do
    [ -f "$pidfile" ] && pids="$pids $(cat "$pidfile")"
  done
  for pid in $pids; do kill -CONT "$pid" 2>/dev/null && kill "$pid" 2>/dev/null; done
  # A server may take a while to stop (or was stopped halfway): 5 s, then SIGKILL.
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    alive=""
    for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive="$alive $pid"; done
    [ -z "$alive" ] && break
    sleep 0.5
  done
  for pid in $alive; do kill -9 "$pid" 2>/dev/null; done
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
