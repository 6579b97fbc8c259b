# SPDX-License-Identifier: MIT
"""The redis-py side of `make bench` (a benchmark, not a test).

Debian's python3-redis Lock, run by /usr/bin/python3, as a user would write it:
``lock = r.lock(name, timeout=10)``, ``lock.acquire()``, ``lock.release()``
(SET NX PX, then a compare-and-delete script by EVALSHA: two round trips).

    redis_py.py cycles PORT N            prints cycles_per_s=<rate> for N cycles
    redis_py.py holder|waiter PORT N KEY one side of bench/handoff.lua's handoff

The handoff sides follow bench/handoff.lua's method step by step (signal
lists, a 5-15 ms hold, the clock read just before release and just after
acquire returns); time.monotonic is CLOCK_MONOTONIC, as is core.now. The waiter
uses Lock's blocking acquire with its default sleep (0.1 s between tries).
"""
import os
import random
import sys
import time

import redis

TTL = 10
HOLD_MS = float(os.environ.get("BENCH_HOLD_MS") or 15)


def cycles(r, n):
    t0 = time.monotonic()
    for _ in range(n):
        lock = r.lock("bench:redis-py", timeout=TTL)
        assert lock.acquire(blocking=False)
        lock.release()
    print("cycles_per_s=%.1f" % (n / (time.monotonic() - t0)))


def side(r, role, n, key):
    signals = redis.Redis(port=r.connection_pool.connection_kwargs["port"])
    held, free = key + ":held", key + ":free"
    times = []
    for i in range(1, n + 1):
        if role == "holder":
            if i > 1:
                assert signals.blpop(free, 30), "the waiter went quiet"
            lock = r.lock(key, timeout=TTL)
            assert lock.acquire(blocking=False)
            signals.rpush(held, i)
            time.sleep((5 + random.random() * (HOLD_MS - 5)) / 1000)
            times.append(time.monotonic())
            lock.release()
        else:
            assert signals.blpop(held, 30), "the holder went quiet"
            lock = r.lock(key, timeout=TTL)
            assert lock.acquire(blocking_timeout=5)
            times.append(time.monotonic())
            lock.release()
            signals.rpush(free, i)
    for i, t in enumerate(times, 1):
        print("t %d %.9f" % (i, t))
    print("not_blocked 0")


def main():
    mode, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    r = redis.Redis(port=port)
    if mode == "cycles":
        cycles(r, n)
    elif mode in ("holder", "waiter"):
        side(r, mode, n, sys.argv[4])
    else:
        sys.exit("usage: redis_py.py cycles PORT N | holder|waiter PORT N KEY")


if __name__ == "__main__":
    main()
