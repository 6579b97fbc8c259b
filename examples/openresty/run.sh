#!/bin/sh
# SPDX-License-Identifier: MIT
# The OpenResty examples (examples/openresty/redislock.conf) on a private nginx
# and a private redis-server (tools/with-redis.sh), both on free loopback
# ports, in a temporary folder, stopped by their PIDs (never by name):
#
#   sh examples/openresty/run.sh           # try each example with curl, say what
#                                          # happened; exit 1 if anything was off
#   sh examples/openresty/run.sh --serve   # keep nginx running until Ctrl-C
#
# Needs nginx with Debian's lua module (libnginx-mod-http-lua, lua-resty-core),
# curl, and what `make` needs: it runs `make all` for the LuaJIT build of
# redislock.core (build/luajit/redislock/core.so).
set -u
cd "$(dirname "$0")/../.." || exit 2

usage() { echo "usage: sh examples/openresty/run.sh [--serve]" >&2; exit 2; }
case $# in
  0) mode=check ;;
  1) [ "$1" = --serve ] || usage; mode=serve ;;
  *) usage ;;
esac

MODULES=/usr/lib/nginx/modules

# First pass: check the tools, build, then run again with a redis-server.
if [ -z "${REDISLOCK_OPENRESTY_INNER-}" ]; then
  for tool in nginx curl make lua5.4 redis-server redis-cli; do
    command -v "$tool" >/dev/null || { echo "redislock: $tool not found (make deps; apt-get install curl)" >&2; exit 2; }
  done
  for mod in ndk_http_module.so ngx_http_lua_module.so; do
    [ -f "$MODULES/$mod" ] || { echo "redislock: no $MODULES/$mod (apt-get install libnginx-mod-http-lua)" >&2; exit 2; }
  done
  make -s all || exit 2
  REDISLOCK_OPENRESTY_INNER=1
  export REDISLOCK_OPENRESTY_INNER
  exec sh tools/with-redis.sh sh examples/openresty/run.sh "$@"
fi

# Second pass, under tools/with-redis.sh: REDIS_URL, REDIS_PORT and REDIS_DIR
# are set, and REDIS_DIR (removed afterwards) holds nginx's prefix too.
root=$(pwd -P)
prefix=$REDIS_DIR/nginx
out=$prefix/out
mkdir -p "$prefix/conf" "$prefix/logs" "$prefix/temp" "$out" || exit 2

# A free port, as tools/with-redis.sh finds one.
free_port() {
  lua5.4 -e 'local s = assert(require("socket").bind("127.0.0.1", 0))
             print((select(2, s:getsockname()))) s:close()' 2>/dev/null ||
    awk -v seed="$$$1" 'BEGIN { srand(seed); print 20000 + int(rand() * 40000) }'
}

# nginx.conf around redislock.conf: Debian's lua module, everything nginx
# writes under the prefix, this checkout's Lua code and LuaJIT build on the
# package paths, and `env REDIS_URL;` so that the workers see REDIS_URL (nginx
# clears their environment). As root the workers would run as nobody, who may
# not be able to read the checkout nor enter the temporary folder: user root.
write_conf() {
  user=""
  [ "$(id -u)" = 0 ] && user="user root;"
  cat > "$prefix/conf/nginx.conf" <<EOF
# Written by examples/openresty/run.sh
load_module $MODULES/ndk_http_module.so;
load_module $MODULES/ngx_http_lua_module.so;
$user
worker_processes 2;
daemon on;
pid "$prefix/nginx.pid";
error_log "$prefix/logs/error.log" notice;
env REDIS_URL;
events { worker_connections 256; }
http {
    access_log "$prefix/logs/access.log";
    client_body_temp_path "$prefix/temp/client_body";
    proxy_temp_path "$prefix/temp/proxy";
    fastcgi_temp_path "$prefix/temp/fastcgi";
    uwsgi_temp_path "$prefix/temp/uwsgi";
    scgi_temp_path "$prefix/temp/scgi";
    lua_package_path "$root/lua/?.lua;$root/examples/openresty/lua/?.lua;;";
    lua_package_cpath "$root/build/luajit/?.so;;";
    include "$prefix/conf/redislock.conf";
}
EOF
  sed "s/__PORT__/$port/g" examples/openresty/redislock.conf > "$prefix/conf/redislock.conf"
}

stop_nginx() {
  [ -n "${sleeper-}" ] && kill "$sleeper" 2>/dev/null
  [ -f "$prefix/nginx.pid" ] || return 0
  pid=$(cat "$prefix/nginx.pid")
  for sig in QUIT TERM; do
    kill -"$sig" "$pid" 2>/dev/null || break
    # nginx removes its pid file as it exits (the process may linger as a
    # zombie if nothing reaps it): wait for that, up to 5 s.
    n=0
    while [ -f "$prefix/nginx.pid" ] && [ $n -lt 100 ]; do
      sleep 0.05
      n=$((n + 1))
    done
    [ -f "$prefix/nginx.pid" ] || break
  done
  rm -f "$prefix/nginx.pid"
}
trap stop_nginx EXIT
trap 'exit 130' INT TERM

# Starts nginx on a free port; someone may take the port first, so a failed
# start is retried. LUA_PATH and LUA_CPATH (set by with-redis.sh for Lua 5.4)
# are kept away from nginx: LuaJIT would put them into the ";;" defaults.
port=""
for try in 1 2 3 4 5; do
  p=$(free_port "$try")
  port=$p
  write_conf
  : > "$prefix/logs/error.log"
  if env -u LUA_PATH -u LUA_CPATH -u LUA_PATH_5_4 -u LUA_CPATH_5_4 \
       nginx -p "$prefix/" -e "$prefix/logs/error.log" -c "$prefix/conf/nginx.conf" \
       > "$prefix/logs/start.log" 2>&1; then
    n=0
    until curl -s -o /dev/null "http://127.0.0.1:$p/orders/" || [ $n -ge 100 ]; do
      sleep 0.05
      n=$((n + 1))
    done
    [ $n -lt 100 ] && break
  fi
  port=""
  stop_nginx
  grep -q "Address already in use" "$prefix/logs/start.log" "$prefix/logs/error.log" || break
done
if [ -z "$port" ]; then
  echo "redislock: cannot start nginx; it says:" >&2
  cat "$prefix/logs/start.log" "$prefix/logs/error.log" >&2
  exit 2
fi
base=http://127.0.0.1:$port

echo "redislock OpenResty examples: nginx (2 workers) at $base, redis-server at 127.0.0.1:$REDIS_PORT"

if [ "$mode" = serve ]; then
  cat <<EOF
Try:
  curl -X POST $base/orders/1                    # (a) guarded: one at a time per order
  curl $base/orders/1                            #     the order's update count
  curl -X POST '$base/lock/payments:7?ttl=30'    # (b) take a lock, note the token
  curl -X DELETE '$base/lock/payments:7?token=...'
  curl -i $base/report                           # (c) cached; one rebuild at a time
  curl $base/metrics                             # (d) metrics for Prometheus
nginx's error log: $prefix/logs/error.log
Ctrl-C stops nginx and redis-server.
EOF
  # In the background, so that a TERM sent to this shell alone stops it too.
  while :; do
    sleep 3600 &
    sleeper=$!
    wait "$sleeper"
  done
fi

failed=0

# check WHAT GOT EXPECTED
check() {
  [ "$2" = "$3" ] && return 0
  echo "  FAILED: $1: got '$2', expected '$3'"
  failed=1
}

# fire NAME N METHOD PATH: N concurrent requests. Each leaves its status,
# headers and body in $out/NAME/<i>.code, .head and .body.
fire() {
  d=$out/$1
  mkdir -p "$d"
  i=1
  while [ "$i" -le "$2" ]; do
    curl -s -m 20 -X "$3" -o "$d/$i.body" -D "$d/$i.head" -w '%{http_code}\n' "$base$4" > "$d/$i.code" &
    i=$((i + 1))
  done
  wait
}

# how_many NAME STATUS: how many of NAME's answers had that status.
how_many() {
  cat "$out/$1"/*.code | grep -c "^$2\$"
}

# with_header NAME TEXT: how many of NAME's answers had a header line starting with TEXT.
with_header() {
  grep -il "^$2" "$out/$1"/*.head | wc -l | tr -d ' '
}

# workers NAME: how many nginx workers answered NAME's requests (X-Worker).
workers() {
  cat "$out/$1"/*.head | sed -n 's/^x-worker: *\([0-9]*\).*/\1/ip' | sort -u | wc -l | tr -d ' '
}

# request METHOD PATH: one request; sets $code and $body.
request() {
  rm -f "$out/last.body"
  code=$(curl -s -m 20 -X "$1" -o "$out/last.body" -w '%{http_code}' "$base$2")
  body=$(cat "$out/last.body" 2>/dev/null)
}

# field NAME [JSON]: a string (unescaped) or number field of a flat JSON
# object, $body by default.
field() {
  printf '%s\n' "${2-$body}" |
    sed -n 's/.*"'"$1"'":"\(\([^"\\]\|\\.\)*\)".*/\1/p; s/.*"'"$1"'":\([-0-9.a-z]\{1,\}\).*/\1/p' |
    sed 's/\\\(["\\/]\)/\1/g'
}

redis() {
  redis-cli -p "$REDIS_PORT" "$@"
}

# (a) The guard.
fire guard 4 POST /orders/1
request GET /orders/1
updates=$(field updates)
fences=$(for f in "$out"/guard/*.body; do field fence "$(cat "$f")"; done | sort -n | tr '\n' ' ')
# The log phase hands the lock to a timer: it is released just after the response.
n=0
while [ "$(redis exists 'lock:{order:1}')" != 0 ] && [ $n -lt 40 ]; do sleep 0.05; n=$((n + 1)); done
left=$(redis exists 'lock:{order:1}')
echo "guard:     4 concurrent POST /orders/1 (0.1 s of work each, $(workers guard) workers):" \
     "$(how_many guard 200) x 200, one at a time (fences ${fences% }); updates counted: $updates"
check "guard: answers 200" "$(how_many guard 200)" 4
check "guard: updates of order 1" "$updates" 4
check "guard: lock:{order:1} still there after the last answer" "$left" 0

fire busy 3 POST "/orders/2?work=3"
echo "guard:     3 concurrent POST /orders/2?work=3 (the guard waits 2 s):" \
     "$(how_many busy 200) x 200, $(how_many busy 409) x 409"
for f in "$out"/busy/*.body; do
  m=$(field message "$(cat "$f")")
  [ -n "$m" ] && { echo "           409 says: $m"; break; }
done
check "guard: answers 200 to a 3 s job" "$(how_many busy 200)" 1
check "guard: answers 409 while a 3 s job runs" "$(how_many busy 409)" 2

fire unguarded 4 POST /unguarded/orders/3
request GET /unguarded/orders/3
updates=$(field updates)
echo "unguarded: 4 concurrent POST /unguarded/orders/3: $(how_many unguarded 200) x 200," \
     "but updates counted: $updates ($((4 - ${updates:-0})) lost)"
check "unguarded: answers 200" "$(how_many unguarded 200)" 4

# (b) The lock service.
request POST "/lock/payments:7?ttl=5"
c1=$code token=$(field token) fence1=$(field fence)
request POST "/lock/payments:7"
c2=$code busy=$(field error)
request DELETE "/lock/payments:7?token=0123456789abcdef0123456789abcdef"
c3=$code
request DELETE "/lock/payments:7?token=$token"
c4=$code
request DELETE "/lock/payments:7?token=$token"
c5=$code lost=$(field error)
echo "lock:      POST /lock/payments:7 -> $c1 (fence $fence1); again -> $c2 $busy;" \
     "DELETE with another token -> $c3; with its token -> $c4; again -> $c5 $lost"
check "lock: POST" "$c1" 200
check "lock: token" "$(printf '%s' "$token" | grep -c '^[0-9a-f]\{32\}/[^/]*/[0-9]*/[0-9]*$')" 1
check "lock: POST while held" "$c2 $busy" "409 busy"
check "lock: DELETE with another token" "$c3" 409
check "lock: DELETE" "$c4" 200
check "lock: DELETE again" "$c5 $lost" "409 lost"

request POST "/lock/payments:7?ttl=0.5"
c6=$code fence6=$(field fence)
request POST "/lock/payments:7?wait=2"
c7=$code fence7=$(field fence) token7=$(field token)
request POST "/lock/payments:7?ttl=abc"
c8=$code
request DELETE "/lock/payments:7?token=$token7"
echo "lock:      POST ?ttl=0.5 -> $c6; POST ?wait=2 -> $c7 once that expired (fence $fence7);" \
     "POST ?ttl=abc -> $c8"
check "lock: POST ?ttl=0.5" "$c6" 200
# Fences only grow (by more than one now and then: a try that found the lock
# held counted one too).
grew=$([ "${fence7:-0}" -gt "${fence6:-0}" ] 2>/dev/null && echo "a larger fence" || echo "fence $fence7 after $fence6")
check "lock: POST ?wait=2 on a 0.5 s lock" "$c7 $grew" "200 a larger fence"
check "lock: POST ?ttl=abc" "$c8" 400

# (c) The stampede guard.
redis del example:report example:report:rebuilds > /dev/null
fire stampede 20 GET /report
rebuilds=$(redis get example:report:rebuilds)
echo "stampede:  20 concurrent GET /report ($(workers stampede) workers): $(how_many stampede 200) x 200," \
     "$rebuilds rebuild ($(with_header stampede 'x-cache: rebuilt') rebuilt it," \
     "$(with_header stampede 'x-cache: waited') waited for it, $(with_header stampede 'x-cache: hit') found it cached)"
check "stampede: answers 200" "$(how_many stampede 200)" 20
check "stampede: rebuilds" "$rebuilds" 1

redis del example:report example:report:rebuilds > /dev/null
fire stampede_unguarded 20 GET /unguarded/report
echo "unguarded: 20 concurrent GET /unguarded/report: $(how_many stampede_unguarded 200) x 200," \
     "$(redis get example:report:rebuilds) rebuilds"

# (d) The metrics: what the examples above did, as redislock.metrics counted
# it. total NAME: the sum of a family's samples of locks (every group).
request GET /metrics
total() {
  printf '%s\n' "$body" | awk -v name="$1" '
    index($0, name "{kind=\"lock\",") == 1 { sum += $NF; n++ }
    END { if (n) printf "%.14g\n", sum }'
}
acquired=$(total redislock_acquisitions_total)
busy=$(total redislock_busy_total)
released=$(total redislock_releases_total)
held=$(total redislock_hold_seconds_sum)
waited=$(total redislock_wait_seconds_sum)
echo "metrics:   GET /metrics -> $code: locks acquired $acquired, busy $busy, released $released," \
     "waited ${waited:-?} s and held ${held:-?} s in all"
check "metrics: answers 200" "$code" 200
check "metrics: counts the guard's locks and more" "$([ "${acquired:-0}" -ge 8 ] && echo yes || echo "${acquired:-none}")" yes
check "metrics: counts the 409s" "$([ "${busy:-0}" -ge 3 ] && echo yes || echo "${busy:-none}")" yes
check "metrics: counts releases" "$([ "${released:-0}" -ge 4 ] && echo yes || echo "${released:-none}")" yes
check "metrics: a histogram per group" \
  "$(printf '%s\n' "$body" | grep -c '^redislock_wait_seconds_bucket{kind="lock",group="order",le="+Inf"} ')" 1

# Nothing went wrong on nginx's side either.
if grep -E '\[(error|crit|alert|emerg)\]' "$prefix/logs/error.log" > "$out/errors"; then
  echo "  FAILED: nginx's error log has errors:"
  head -n 20 "$out/errors"
  failed=1
fi

if [ $failed != 0 ]; then
  echo "FAILED: see above"
  exit 1
fi
echo "ok: every example did what it says"
