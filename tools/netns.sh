# SPDX-License-Identifier: MIT
# Sourced by spec/run.sh and torture/run.sh. As root, where iptables can add
# a rule inside a network namespace of its own, sets netns=1, and
# isolated CMD... runs CMD in a fresh namespace (its own loopback, brought up
# here): servers may then listen on other 127.0.0.x addresses, and iptables
# rules cut them apart and go with the namespace. Elsewhere netns=0, and
# isolated runs CMD as it is.
netns=0
if [ "$(id -u)" = 0 ] && command -v iptables >/dev/null &&
   unshare --net sh -c 'ip link set lo up && iptables -A INPUT -s 127.0.0.2 -j DROP' 2>/dev/null; then
  netns=1
fi
isolated() {
  if [ "$netns" = 1 ]; then
    unshare --net sh -c 'ip link set lo up && exec "$@"' isolated "$@"
  else
    "$@"
  fi
}
