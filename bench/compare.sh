#!/bin/sh
# SPDX-License-Identifier: MIT
# Benchmark (not a test): this checkout against an earlier revision, in one
# run, on one server. bench/cycle.lua runs for each side in turn (Lua 5.4 and
# LuaJIT, the client on another core, then on the server's), ROUNDS times, so
# that both sides meet the same machine; each prints its acquire+release
# ratio to the raw floor of its own bytes, taken in the same slices, and the
# server's CPU time per cycle (INFO cpu), and its with_lock rate (an empty
# fn, its lock given to the renewal: make bench's renewal figure). At the
# end: the medians over the rounds, this checkout's as a ratio of the other
# revision's.
#   sh bench/compare.sh REV [ROUNDS]      e.g. sh bench/compare.sh HEAD~3 2
# With BENCH_COMPARE=contend, bench/contend.lua (Lua 5.4) takes cycle.lua's
# place: contended acquisitions per second per waiting mode and number of
# processes (BENCH_CONTEND_PROCS, default "8 32" here; BENCH_CONTEND_MODES
# keeps some modes), each side in turn, with the mean section and gap of an
# acquisition, the CPU time it cost and the share of acquisitions made by
# the process that made the one before. Both sides run this
# checkout's bench/contend.lua (the same workload and measures) on their
# own library; a waiting mode the other revision refuses is left out there.
# The revision is built in a temporary git worktree, removed at the end.
# BENCH_SLICES (default 9 here) and the other knobs of bench/cycle.lua apply.
cd "$(dirname "$0")/.." || exit 2
if [ -z "${REDIS_PORT:-}" ]; then
  exec sh tools/with-redis.sh sh bench/compare.sh "$@"
fi
set -u
rev=${1:?usage: sh bench/compare.sh REV [ROUNDS]}
rounds=${2:-2}
here=$PWD
other=$(mktemp -d)
trap 'git -C "$here" worktree remove --force "$other" >/dev/null 2>&1; rm -rf "$other"' EXIT
git worktree add --detach "$other" "$rev" >/dev/null 2>&1 || { echo "bench: cannot check out $rev" >&2; exit 2; }
make -C "$other" all build/bench/floor >/dev/null 2>&1 || { echo "bench: cannot build $rev" >&2; exit 2; }
make all build/bench/floor >/dev/null || exit 2
export BENCH_SLICES="${BENCH_SLICES:-9}"
taskset -apc 0 "$(cat "$REDIS_DIR/redis.pid")" >/dev/null
last=$(($(nproc) - 1))

# side NAME TREE LUA BUILD PLACEMENT CPU: one cycle.lua run; prints its
# cycle rate and ratio, and the server's CPU time per cycle.
side() {
  path="$2/bench/?.lua;$2/lua/?.lua;;" cpath="$2/build/$4/?.so;;"
  LUA_PATH=$path LUA_PATH_5_4=$path LUA_CPATH=$cpath LUA_CPATH_5_4=$cpath BENCH_ROOT=$2 \
    taskset -c "$6" "$3" "$2/bench/cycle.lua" "$5" 2>/dev/null |
    sed -n -e "s/^bench name=cycle\/\([^ ]*\) value=\([0-9]*\) .* ratio=\([0-9.]*\) .*/$1 \1 \2 cycles\/s, ratio to its floor \3/p" \
           -e "s/^bench name=server_cpu\/\([^ ]*\) value=\([0-9.]*\) .*/$1 \1 server CPU \2 us\/cycle/p" \
           -e "s/^bench name=with_lock\/\([^ ]*\) value=\([0-9]*\) .*/$1 with_lock:\1 \2 with_locks\/s (renewal on)/p" |
    tee -a "$results"
}
# contend NAME TREE: one contend.lua run; prints its acquisitions/s per mode
# and number of processes, the mean section and gap of an acquisition and
# the CPU time it cost, workers and server together (bench/contend.lua), in
# us, and the share of acquisitions made by the process that made the one
# before.
contend() {
  path="$here/bench/?.lua;$2/lua/?.lua;;" cpath="$2/build/lua5.4/?.so;;"
  LUA_PATH=$path LUA_PATH_5_4=$path LUA_CPATH=$cpath LUA_CPATH_5_4=$cpath BENCH_ROOT=$here BENCH_CONTEND_FLOOR=0 \
    lua5.4 "$here/bench/contend.lua" 2>/dev/null |
    sed -n -e "s/^bench name=contended\/\([^ ]*\) value=\([0-9]*\) .*/$1 \1 \2 acquisitions\/s/p" \
           -e "s/^bench name=contended\.\(section\|gap\|cpu\)\/\([^ ]*\) value=\([0-9]*\) .*/$1 \1:\2 \3 us/p" \
           -e "s/^bench name=contended\.again\/\([^ ]*\) value=\([0-9]*\) .*/$1 again:\1 \2 %/p" \
           -e "s/^bench name=contended.ceiling value=\([0-9]*\) .*/$1 ceiling \1 sections\/s (the section alone)/p" |
    tee -a "$results"
}
what=${BENCH_COMPARE:-cycle}
export BENCH_CONTEND_PROCS="${BENCH_CONTEND_PROCS:-8 32}"
results=$(mktemp)
trap 'git -C "$here" worktree remove --force "$other" >/dev/null 2>&1; rm -rf "$other" "$results"' EXIT

echo "bench compare: this checkout ($(git rev-parse --short HEAD)) vs $rev ($(git -C "$other" rev-parse --short HEAD)), $rounds rounds"
for _ in $(seq "$rounds"); do
  if [ "$what" = contend ]; then
    contend this "$here"
    contend "$rev" "$other"
    continue
  fi
  for placement in "different-cores:$last" "same-core:0"; do
    where=${placement%%:*} cpu=${placement##*:}
    for pair in "lua5.4:lua5.4" "luajit:luajit"; do
      lua=${pair%%:*} build=${pair#*:}
      side this "$here" "$lua" "$build" "$where" "$cpu"
      side "$rev" "$other" "$lua" "$build" "$where" "$cpu"
    done
  done
done

# The medians over the rounds, and this checkout's as a ratio of the other's.
awk -v rev="$rev" '
  function median(list,   n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  $3 == "server" { cpu[$1 " " $2] = cpu[$1 " " $2] " " $5; next }
  { rate[$1 " " $2] = rate[$1 " " $2] " " $3; seen[$2] = 1 }
  END {
    for (id in seen) {
      if (!((rev " " id) in rate)) {
        printf "median %s: this %d (%s has none)\n", id, median(rate["this " id]), rev
        continue
      }
      d = median(rate[rev " " id])
      r = d > 0 ? median(rate["this " id]) / d : 0
      if (!(("this " id) in cpu)) {
        unit = id ~ /^(section|gap|cpu):/ ? "us" : id ~ /^again:/ ? "%" : "per second"
        printf "median %s: %s this %d, %s %d (this/%s %s)\n", id, unit,
               median(rate["this " id]), rev, d, rev, (d > 0 ? sprintf("%.3f", r) : "n/a")
        continue
      }
      c = median(cpu["this " id]) / median(cpu[rev " " id])
      printf "median %s: cycles/s this %d, %s %d (this/%s %.3f); server CPU us/cycle this %.2f, %s %.2f (this/%s %.3f)\n",
             id, median(rate["this " id]), rev, median(rate[rev " " id]), rev, r,
             median(cpu["this " id]), rev, median(cpu[rev " " id]), rev, c
    }
  }' "$results" | sort
