#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs the busted suite once per "interpreter:module-build-dir" argument, e.g.
#   sh spec/run.sh lua5.4:build/lua5.4 luajit:build/luajit
# Spec files may follow (sh spec/run.sh lua5.4:build/lua5.4 spec/02-lock_spec.lua);
# without, every spec/*_spec.lua runs.
#
# Each (interpreter, file) pair is a job of its own: its own busted process,
# temporary folder (REDISLOCK_TEST_TMP, where spec/helpers.lua puts its
# servers' folders) and, as root, network namespace (tools/netns.sh), so its
# servers' ports and iptables rules are its alone. REDISLOCK_JOBS jobs run at
# once (default 4; 2 under REDISLOCK_WRAP), both interpreters' mixed, the
# longest files first; a file whose header has a line "-- run.sh: alone"
# runs after the others, with nothing beside it. Each job's output goes to
# <build>/logs/<file>.log; a line per job says how it ended and where its log
# is, the logs of those that failed are printed at the end, and the last line
# is "N passed, N failed, N skipped" summed over every job (a job that ended
# without busted's summary, crashed or timed out, counts as one failure).
# Exit status 0 only when every job passed.
#
# REDISLOCK_WRAP (e.g. valgrind ...) prefixes the interpreter;
# REDISLOCK_PRELOAD is put in LD_PRELOAD for the interpreter (and the Lua
# workers it spawns; spec/helpers.lua drops it for other commands).
# REDISLOCK_FILE_TIMEOUT: seconds a file may take (default 900, 10 times that
# under REDISLOCK_SLOW). REDISLOCK_FILTER: only the tests whose names match
# one of these Lua patterns, "|" between them (busted --filter), e.g. to run
# a few in a loop.
set -u
cd "$(dirname "$0")/.." || exit 2
root=$(pwd)

# One job (run by xargs below): "--job <lua> <build> <spec file>".
if [ "${1:-}" = "--job" ]; then
  lua=$2 build=$3 file=$4
  name=$(basename "$file" .lua)
  dir="$REDISLOCK_RUN_TMP/$lua-$(basename "$build")-$name"
  log="$build/logs/$name.log"
  mkdir -p "$dir" "$build/logs"
  . tools/netns.sh
  set --
  rest=${REDISLOCK_FILTER:-}
  while [ -n "$rest" ]; do
    set -- "$@" "--filter=${rest%%|*}"
    case "$rest" in *"|"*) rest=${rest#*|} ;; *) rest="" ;; esac
  done
  start=$(date +%s.%N)
  # In the background, the PID of the shell that runs it in the job's folder:
  # an interrupted run stops its jobs by it (TERM to that shell's child,
  # timeout, which passes it on to busted).
  isolated env REDISLOCK_TEST_TMP="$dir" REDISLOCK_LUA="$lua" REDISLOCK_COUNTS="$dir/counts" \
    REDISLOCK_CPATH="$root/$build/?.so" REDISLOCK_NETNS="$netns" \
    LUA_PATH="$root/lua/?.lua;$root/?.lua;;" LUA_CPATH="$root/$build/?.so;;" \
    LD_PRELOAD="${REDISLOCK_PRELOAD:-}" \
    timeout -k 10 "$REDISLOCK_FILE_TIMEOUT" \
    ${REDISLOCK_WRAP:-} "$lua" "$(command -v busted)" --output="$root/spec/output.lua" \
    "$@" "$root/$file" > "$log" 2>&1 &
  echo $! > "$dir/job.pid"
  wait $!
  code=$?
  took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
  # Servers a crashed spec left behind: stopped by PID, never by name.
  for pidfile in "$dir"/*/*.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null
  done
  counts=$(cat "$dir/counts" 2>/dev/null)
  if [ -z "$counts" ]; then
    if [ "$code" = 124 ] || [ "$code" = 137 ]; then
      why="timed out after $REDISLOCK_FILE_TIMEOUT s"
    else
      why="ended without a summary (crashed? exit $code)"
    fi
    counts="$lua 0 1 0"
    result=CRASH
  else
    set -- $counts
    if [ "$code" = 0 ] && [ "$3" = 0 ]; then result=ok; else result=FAIL; fi
    why="$2 passed, $3 failed, $4 skipped"
  fi
  echo "$counts $result $file $log" 2>/dev/null > "$REDISLOCK_RUN_TMP/result.$lua-$(basename "$build")-$name"
  rm -rf "$dir"
  printf '%-5s %-6s %-32s %4ss  %s  (%s)\n' "$result" "$lua" "$file" "$took" "$why" "$log"
  exit 0
fi

tmp=$(mktemp -d)
cleanup() {
  # Jobs still running (an interrupted run), then servers a crashed or
  # interrupted spec left behind: stop them by PID, never by name.
  [ -n "${xargs_pid:-}" ] && kill "$xargs_pid" 2>/dev/null
  for pidfile in "$tmp"/*/job.pid; do
    [ -f "$pidfile" ] && kill $(ps -o pid= --ppid "$(cat "$pidfile")") 2>/dev/null
  done
  for pidfile in "$tmp"/*/*/*.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

command -v busted >/dev/null || { echo "redislock: busted not found (make deps)" >&2; exit 2; }

pairs="" files=""
for a in "$@"; do
  case "$a" in
    *_spec.lua) files="$files $a" ;;
    *:*) pairs="$pairs $a" ;;
    *) echo "usage: sh spec/run.sh lua:build-dir... [spec/NN-topic_spec.lua...]" >&2; exit 2 ;;
  esac
done
[ -n "$pairs" ] || { echo "usage: sh spec/run.sh lua:build-dir... [spec/NN-topic_spec.lua...]" >&2; exit 2; }
[ -n "$files" ] || files=$(ls spec/*_spec.lua)

if [ -n "${REDISLOCK_WRAP:-}" ]; then jobs=${REDISLOCK_JOBS:-2}; else jobs=${REDISLOCK_JOBS:-4}; fi
limit=${REDISLOCK_FILE_TIMEOUT:-900}
[ -n "${REDISLOCK_SLOW:-}" ] && limit=$((limit * 10))

# The order jobs start in: files marked "-- run.sh: long <seconds>" first,
# the longest first (they bound the run's length), then the others; each
# file's jobs for every interpreter side by side. Files marked
# "-- run.sh: alone" run at the end, one at a time.
list() {
  for f in $files; do
    mark=$(sed -n '1,20s/^-- run\.sh: \([a-z]*\) *\([0-9]*\).*/\1 \2/p' "$f" | head -n 1)
    set -- "$1" $mark
    [ "${2:-}" = "$1" ] || continue
    [ -n "${2:-}" ] && [ "$2" = "${REDISLOCK_SKIP:-}" ] && continue
    echo "${3:-0} $f"
  done | sort -k 1,1nr -s | while read -r _ f; do
    for pair in $pairs; do
      echo "${pair%%:*} ${pair#*:} $f"
    done
  done
}
. tools/netns.sh
[ "$netns" = 1 ] && where="each in a network namespace of its own" || where="without network namespaces (not root)"
{ list long; list ""; } > "$tmp/jobs"
list alone > "$tmp/alone"
echo "== $(cat "$tmp/jobs" "$tmp/alone" | wc -l) spec jobs ($(echo $pairs)${REDISLOCK_SKIP:+; files marked $REDISLOCK_SKIP left out}), $jobs at a time, $where"

export REDISLOCK_RUN_TMP="$tmp" REDISLOCK_FILE_TIMEOUT="$limit"
# xargs in the background and wait: a shell runs its traps only once the
# command it waits for in the foreground ends.
xargs -r -L 1 -P "$jobs" sh spec/run.sh --job < "$tmp/jobs" &
xargs_pid=$!
wait $xargs_pid
if [ -s "$tmp/alone" ]; then
  echo "== one at a time"
  xargs -r -L 1 -P 1 sh spec/run.sh --job < "$tmp/alone" &
  xargs_pid=$!
  wait $xargs_pid
fi
xargs_pid=""

status=0
for r in "$tmp"/result.*; do
  [ -f "$r" ] || { status=1; continue; }
  # shellcheck disable=SC2046
  set -- $(cat "$r")
  [ "$5" = ok ] && continue
  status=1
  echo
  echo "== $5: $1 $6 (log: $7)"
  cat "$7"
done
expected=$(cat "$tmp/jobs" "$tmp/alone" | wc -l)
got=$(ls "$tmp" | grep -c '^result\.')
if [ "$got" != "$expected" ]; then
  echo "redislock: $got of $expected spec jobs reported" >&2
  status=1
fi
cat "$tmp"/result.* 2>/dev/null | awk -v s="$status" '{ p += $2; f += $3; k += $4 }
  END { if (s != 0 && f == 0) f = 1; printf "%d passed, %d failed, %d skipped\n", p, f, k }'
exit $status
