#!/bin/sh
# SPDX-License-Identifier: MIT
# A shell job that writes its result fenced, under the `redislock` command:
#
#   redislock run --ttl 300 report -- sh examples/fenced_job.sh write
#
# The job sees the lock's fence in REDISLOCK_FENCE, and writes its result to
# "report:latest" only when that fence is at least the highest the key has
# accepted: the same record lock:fenced() keeps ("{report:latest}:fence"),
# so Lua writers and shell jobs guard one resource together. A job that was
# paused past its lock's TTL and writes after a later holder is refused.
#
# Run by hand from the checkout (needs a redis-server and redis-cli;
# REDIS_URL, else 127.0.0.1:6379; LUA_PATH and LUA_CPATH as `make test` sets
# them): sh examples/fenced_job.sh. It takes the lock "report" twice, each
# run writing its result, then plays a stale job with the first run's fence
# (one that wrote, then was overtaken), and prints what each did.
set -u
cd "$(dirname "$0")/.." || exit 2
URL=${REDIS_URL:-redis://127.0.0.1:6379}

# The fenced write: the result goes in only with a fence at least the record's.
FENCED_SET="
local top = redis.call('GET', KEYS[2])
if top and tonumber(top) > tonumber(ARGV[1]) then return 'refused: ' .. KEYS[1] .. ' accepted fence ' .. top end
redis.call('SET', KEYS[1], ARGV[2])
if top ~= ARGV[1] then redis.call('SET', KEYS[2], ARGV[1]) end
return 'written with fence ' .. ARGV[1]"

if [ "${1:-}" = write ]; then
  redis-cli -u "$URL" --no-raw EVAL "$FENCED_SET" 2 report:latest "{report:latest}:fence" "$REDISLOCK_FENCE" \
    "${2:-made by job $$}" | tr -d '"'
  exit
fi

LUA=${REDISLOCK_LUA:-lua5.4}
# `make asan` preloads the sanitizers (REDISLOCK_PRELOAD) for the command only.
run_lua() {
  if [ -n "${REDISLOCK_PRELOAD-}" ]; then LD_PRELOAD=$REDISLOCK_PRELOAD "$LUA" "$@"; else "$LUA" "$@"; fi
}
redis-cli -u "$URL" DEL report:latest "{report:latest}:fence" > /dev/null
run1=$(run_lua bin/redislock run report -- env -u LD_PRELOAD sh examples/fenced_job.sh write "run 1")
echo "run 1: $run1"
first=${run1##* } # "written with fence N"
echo "run 2: $(run_lua bin/redislock run report -- env -u LD_PRELOAD sh examples/fenced_job.sh write "run 2")"
echo "a stale job with fence $first: $(REDISLOCK_FENCE=$first sh examples/fenced_job.sh write "stale")"
echo "report:latest says: $(redis-cli -u "$URL" --raw GET report:latest)"
