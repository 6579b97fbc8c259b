#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs the busted suite once per "interpreter:module-build-dir" argument, e.g.
#   sh spec/run.sh lua5.4:build/lua5.4 luajit:build/luajit
# and ends with one line "N passed, N failed, N skipped" summed over the runs.
# Exit status 0 only when every run passed. Each spec file starts and stops its
# own redis-server (spec/helpers.lua) under a temporary folder removed here.
# REDISLOCK_WRAP (e.g. valgrind ...) prefixes the interpreter;
# REDISLOCK_PRELOAD is put in LD_PRELOAD for the interpreter (and the Lua
# workers it spawns; spec/helpers.lua drops it for other commands).
set -u
cd "$(dirname "$0")/.." || exit 2
root=$(pwd)

tmp=$(mktemp -d)
cleanup() {
  # Servers a crashed spec left behind: stop them by PID, never by name.
  for pidfile in "$tmp"/*/*.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

busted=$(command -v busted) || { echo "redislock: busted not found (make deps)" >&2; exit 2; }

# As root, each run is in a network namespace of its own (tools/netns.sh):
# specs may then put servers on other 127.0.0.x addresses and cut them apart
# with iptables (REDISLOCK_NETNS=1). Elsewhere those specs are skipped, and
# say so.
. tools/netns.sh
counts="$tmp/counts"
: > "$counts"
status=0

for pair in "$@"; do
  lua=${pair%%:*}
  build=${pair#*:}
  echo "== $lua ($build)"
  if ! isolated env REDISLOCK_TEST_TMP="$tmp" REDISLOCK_LUA="$lua" REDISLOCK_COUNTS="$counts" \
       REDISLOCK_CPATH="$root/$build/?.so" REDISLOCK_NETNS="$netns" \
       LUA_PATH="$root/lua/?.lua;$root/?.lua;;" LUA_CPATH="$root/$build/?.so;;" \
       LD_PRELOAD="${REDISLOCK_PRELOAD:-}" \
       ${REDISLOCK_WRAP:-} "$lua" "$busted" --output="$root/spec/output.lua" "$root/spec"; then
    status=1
  fi
  if ! grep -q "^$lua " "$counts"; then
    echo "redislock: the $lua run ended without a summary (crashed?)" >&2
    status=1
  fi
done

awk -v s="$status" '{ p += $2; f += $3; k += $4 }
  END { if (s != 0 && f == 0) f = 1; printf "%d passed, %d failed, %d skipped\n", p, f, k }' "$counts"
exit $status
