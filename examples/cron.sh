#!/bin/sh
# SPDX-License-Identifier: MIT
# The nightly job with the `redislock` command, as cron would start it on
# several machines at the same minute (here: 5 processes started together).
# Each machine's crontab has the same line:
#
#   15 2 * * * REDIS_URL=rediss://locks.internal:6380 redislock run --ttl 300 nightly-reconcile -- /opt/jobs/reconcile.sh
#
# One machine takes the lock and runs the job (renewed while it runs, so the
# TTL need not cover the worst run); the others find it held and exit 1
# without starting it. The job sees REDISLOCK_FENCE for fenced writes.
#
# Run by hand from the checkout (needs a redis-server; REDIS_URL, else
# 127.0.0.1:6379; LUA_PATH and LUA_CPATH as `make test` sets them, or:
#   LUA_PATH="lua/?.lua;;" LUA_CPATH="build/lua5.4/?.so;;" sh examples/cron.sh
# ). Prints what each machine did; exit status 0 only when exactly one ran it.
set -u
cd "$(dirname "$0")/.." || exit 2
LUA=${REDISLOCK_LUA:-lua5.4}
# `make asan` runs the suite with the sanitizers preloaded (REDISLOCK_PRELOAD):
# the module is built for them. The job itself runs without.
run_lua() {
  if [ -n "${REDISLOCK_PRELOAD-}" ]; then LD_PRELOAD=$REDISLOCK_PRELOAD "$LUA" "$@"; else "$LUA" "$@"; fi
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# The job: a pretend reconciliation of 1 s.
job='echo "machine $MACHINE: running the nightly reconciliation (fence $REDISLOCK_FENCE)"; sleep 1'

for m in 1 2 3 4 5; do
  MACHINE=$m run_lua bin/redislock run --ttl 300 nightly-reconcile -- env -u LD_PRELOAD sh -c "$job" \
    > "$out/$m.out" 2>&1 &
  echo $! > "$out/$m.pid"
done
ran=0
for m in 1 2 3 4 5; do
  wait "$(cat "$out/$m.pid")"
  status=$?
  if [ $status = 0 ]; then
    ran=$((ran + 1))
    cat "$out/$m.out"
  else
    echo "machine $m: skipped (exit $status: $(head -n 1 "$out/$m.out"))"
  fi
done
echo "the nightly job ran on $ran of 5 machines"
[ $ran = 1 ]
