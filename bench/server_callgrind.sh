#!/bin/sh
# SPDX-License-Identifier: MIT
# Benchmark (not a test): the server's instructions per acquire+release,
# counted by valgrind's callgrind inside a private redis-server
# (callgrind_control -z before N cycles, -d after): what the scripts cost
# Redis, without the noise of rates on a busy machine. Two loops: nobody
# waits (the acquire script, then the release's GET, EXISTS, DEL), and a waiters
# mark left in place, so that every release takes its wake-up branch
# (the handoff's functions made, no waiter found, one wake-up pushed).
# Beside them, the minimal lock a user compares with (SET NX PX, then the
# usual compare-and-delete script by EVALSHA, as bench/cycle.lua's).
# With REV, the same loops from that revision (built in a temporary git
# worktree) against the same server, after this checkout's.
#   sh bench/server_callgrind.sh [REV]        (make first; needs valgrind)
cd "$(dirname "$0")/.." || exit 2
set -u
for tool in valgrind callgrind_control redis-server redis-cli lua5.4; do
  command -v "$tool" >/dev/null || { echo "bench: $tool not found" >&2; exit 2; }
done
rev=${1:-}
N=${BENCH_SERVER_CYCLES:-1000}
here=$PWD
tmp=$(mktemp -d)
other=""
cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && sleep 1
  [ -n "$other" ] && git -C "$here" worktree remove --force "$other" >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

make all >/dev/null || exit 2
if [ -n "$rev" ]; then
  other=$(mktemp -d)
  git worktree add --detach "$other" "$rev" >/dev/null 2>&1 || { echo "bench: cannot check out $rev" >&2; exit 2; }
  make -C "$other" all >/dev/null 2>&1 || { echo "bench: cannot build $rev" >&2; exit 2; }
fi

# A free loopback port, then the server under callgrind (hz 1: its timer
# runs once a second, not ten times, among the counted instructions).
port=$(lua5.4 -e 'math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 1000)
  print(math.random(20000, 30000))')
while redis-cli -p "$port" ping >/dev/null 2>&1; do port=$((port + 1)); done
valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.out" \
  redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --hz 1 --dir "$tmp" \
  >"$tmp/server.log" 2>&1 &
pid=$!
n=0
until redis-cli -p "$port" ping >/dev/null 2>&1; do
  n=$((n + 1))
  [ $n -lt 300 ] || { echo "bench: redis-server under callgrind did not start" >&2; exit 1; }
  sleep 0.1
done

# loop TREE CYCLES KEY [mark|minimal]: CYCLES acquire+release cycles on KEY
# from the library of TREE; with mark, a waiters mark is set on KEY first;
# with minimal, the minimal lock's cycles instead, on a raw connection.
loop() {
  LUA_PATH="$1/lua/?.lua;;" LUA_CPATH="$1/build/lua5.4/?.so;;" lua5.4 - "$port" "$2" "$3" "${4:-}" <<'EOF_LOOP'
local redislock = require "redislock"
local core = require "redislock.core"
local port, n, key = tonumber(arg[1]), tonumber(arg[2]), arg[3]
local c = redislock.new({ port = port })
if arg[4] == "mark" then
  local raw = core.new({ port = port })
  assert(raw:command("SET", "lock:{" .. key .. "}:waiters", 1))
  raw:close()
end
if arg[4] == "minimal" then
  local raw = core.new({ port = port })
  local cad = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
  local sha = assert(raw:command("SCRIPT", "LOAD", cad))
  local token = core.token()
  for _ = 1, n do
    assert(raw:command("SET", key, token, "NX", "PX", 10000))
    assert(raw:command("EVALSHA", sha, 1, key, token) == 1)
  end
  raw:close()
  n = 0
end
for _ = 1, n do
  local l = assert(c:acquire(key, 10))
  assert(l:release())
end
c:close()
EOF_LOOP
}

# count NAME TREE KEY [mark]: the server's instructions per cycle.
dumps=0
count() {
  loop "$2" 200 "$3" "${4:-}" || exit 1 # scripts loaded, connections made
  callgrind_control -z "$pid" >/dev/null 2>&1
  loop "$2" "$N" "$3" "${4:-}" || exit 1
  callgrind_control -d "$pid" >/dev/null 2>&1
  dumps=$((dumps + 1))
  total=$(awk '/^(summary|totals):/ { print $2; exit }' "$tmp/cg.out.$dumps")
  echo "bench name=server_instructions/$1 value=$((total / N)) unit=instructions/cycle"
}

count minimal "$here" "sc:minimal" minimal
for side in this ${rev:+other}; do
  if [ "$side" = this ]; then tree=$here; label=this; else tree=$other; label=$rev; fi
  count "$label/uncontended" "$tree" "sc:$side:a"
  count "$label/wake-branch" "$tree" "sc:$side:b" mark
done
