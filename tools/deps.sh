#!/bin/sh
# SPDX-License-Identifier: MIT
# Installs the Debian packages that building, testing and the demo need
# (prometheus for its promtool, which spec/47 checks the metrics' text with).
# Does nothing when they are all present; needs root (apt-get) otherwise.
#   sh tools/deps.sh          what make, make test and make demo need
#   sh tools/deps.sh bench    that, plus the peers make bench compares with
set -eu

PACKAGES="gcc make libc6-dev lua5.4 liblua5.4-dev luajit2 libluajit2-5.1-dev lua-busted luarocks
  libhiredis-dev libssl-dev openssl redis-server redis-tools lua-socket lua-check valgrind curl git zip unzip
  nginx libnginx-mod-http-lua lua-resty-core lua-resty-lrucache lua-nginx-redis iproute2 iptables
  postgresql lua-sql-postgres lua-ldoc man-db prometheus"
# Only make bench needs these: redis-py's Lock (Debian's /usr/bin/python3), and the
# pure-Lua minimal lock (lua5.3 with lua-redis), and ab (apache2-utils) to drive
# nginx with concurrent requests.
BENCH_PACKAGES="python3 python3-redis lua5.3 lua-redis apache2-utils"

case "${1:-}" in
  "") ;;
  bench) PACKAGES="$PACKAGES $BENCH_PACKAGES" ;;
  *) echo "usage: sh tools/deps.sh [bench]" >&2; exit 2 ;;
esac

missing=""
for p in $PACKAGES; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "redislock: missing Debian packages:$missing" >&2
  echo "redislock: install them (apt-get install$missing) or run make as root" >&2
  exit 1
fi
echo "redislock: installing$missing"
export DEBIAN_FRONTEND=noninteractive
# The nginx and redis-server packages start their system services on install
# (nginx on port 80 of every address). The tests start private servers of
# their own, so tell invoke-rc.d not to, unless a policy is already in place.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  # dash runs no EXIT trap when a signal ends it: remove the policy then too.
  trap 'rm -f "$policy"' EXIT
  trap 'rm -f "$policy"; exit 130' INT TERM HUP
fi
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
