#!/bin/sh
# SPDX-License-Identifier: MIT
# Benchmark (not a test): the client's system calls per uncontended
# acquire+release, under Lua 5.4 and LuaJIT, counted by strace -f -c over
# 1,000 and then 3,000 cycles against a private redis-server; the
# difference over 2,000 leaves out loading and the first connection. The
# note names each system call with its count per cycle (those made at
# least once in 200 cycles).
#   sh bench/syscalls.sh [lua5.4] [luajit]   (both by default; make first; needs strace)
cd "$(dirname "$0")/.." || exit 2
. bench/interp.sh
command -v strace >/dev/null || { echo "bench: strace not found" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# count LUA N: strace's table for a process of interpreter LUA that makes a
# client and runs N cycles, into $tmp/LUA.N.
count() {
  loop_under "$1" "$2" "" 'assert(assert(c:acquire("syscalls", 10)):release())' strace -f -c -o "$tmp/$1.$2" ||
    { echo "bench: strace failed ($1)" >&2; exit 1; }
}
[ $# -gt 0 ] || set -- lua5.4 luajit
for lua in "$@"; do
  interpreter "$lua"
  count "$lua" 1000
  count "$lua" 3000
  # strace's rows: % time, seconds, usecs/call, calls, [errors,] name; the
  # calls of each name in the long run less those in the short one.
  awk -v suffix="$suffix" -v name="$name" '
    $1 ~ /^[0-9.]+$/ && NF >= 5 { calls[$NF] += (FILENAME ~ /\.3000$/ ? $4 : -$4) }
    END {
      note = ""
      for (s in calls) if (s != "total" && (calls[s] >= 10 || calls[s] <= -10)) note = note sprintf(" %s %.3g", s, calls[s] / 2000)
      printf "bench name=syscalls/cycle%s value=%.2f unit=syscalls/cycle note=\"strace -f -c, 3000 less 1000:%s\" label=\"client system calls per acquire+release (%s)\"\n", suffix, calls["total"] / 2000, note, name
    }' "$tmp/$lua.1000" "$tmp/$lua.3000"
done
