/* SPDX-License-Identifier: MIT */
/*
 * The Sentinel watch: a thread that stays subscribed to +switch-master on one
 * of a master's sentinels (the next one when it fails) and counts what it
 * hears: a switch of the master, or a subscription lost or made (a switch may
 * have gone unheard meanwhile). The client compares the count before each
 * command (one atomic read) and resolves again when it changed, trying the
 * master a switch announced first (rl_sentinel_watch_heard). On
 * a switch the thread also moves the watchdog's renewals to the new master at
 * once (rl_watchdog_move), so that renewal follows a failover while the Lua
 * state is busy. No Lua here.
 */
#ifndef REDISLOCK_RL_SENTINEL_H
#define REDISLOCK_RL_SENTINEL_H

#include "rl_conn.h"

#pragma GCC visibility push(hidden)

typedef struct rl_sentinel_watch rl_sentinel_watch;

/*
 * Starts watching master on the n sentinels connected as opts[0 .. n-1]
 * (copied). Returns the watch, or NULL with a message in err (out of memory,
 * or the thread could not start).
 */
rl_sentinel_watch *rl_sentinel_watch_start(const rl_conn_opts *opts, int n, const char *master,
                                           char err[RL_ERRLEN]);

/*
 * The count of events so far. In a forked child (where the thread is not)
 * the watch starts a thread of its own first, and the count moves on.
 */
unsigned long rl_sentinel_watch_count(rl_sentinel_watch *w);

/*
 * The master the last switch heard announced, when nothing else was
 * counted since (no subscription lost or made after it): its host
 * copied into host (NUL-terminated) and its port returned; else 0 (none
 * heard, or the count moved on: the announcement may be stale).
 */
int rl_sentinel_watch_heard(rl_sentinel_watch *w, char host[256]);

/* Stops the thread, waits for it and frees the watch. */
void rl_sentinel_watch_stop(rl_sentinel_watch *w);

#pragma GCC visibility pop

#endif
