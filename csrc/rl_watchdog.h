/* SPDX-License-Identifier: MIT */
/*
 * The watchdog: one thread per process that renews held locks (owner-checked
 * pexpire) on connections of its own, so that renewal goes on while the Lua
 * state is busy; when, and what each answer means, is its leases' machine's
 * (rl_renewal.h): the thread only moves time and bytes. No Lua here. It starts with the first lease,
 * is forgotten by a forked child (which starts its own when it needs one),
 * and is stopped and joined when the last Lua state using it closes.
 */
#ifndef REDISLOCK_RL_WATCHDOG_H
#define REDISLOCK_RL_WATCHDOG_H

#include <stddef.h>

#include "rl_conn.h"
#include "rl_renewal.h"

#pragma GCC visibility push(hidden)

typedef struct rl_lease rl_lease;

/*
 * Starts renewing the lock key/token (names as rl_cmd_init builds them from
 * prefix) to ttl_ms every ttl_ms / 3 with the script extend (RL_OP_EXTEND,
 * or a permit's or read-write hold's), on a watchdog connection made like opts
 * (shared by the leases with the same options; its timeouts are cut to
 * ttl_ms / 3). sent_ms is when the acquire was sent (monotonic ms): the TTL
 * runs from no earlier. delay_ms > 0 (a lock delay): each renewal asks the
 * server for ttl_ms + delay_ms, and one not sent, or not answered, within
 * ttl_ms of the last good one marks the lease lost instead (its holder must
 * stop at its TTL: rl_renewal_delay).
 * max_hold_ms > 0 stops the renewals that long after
 * now. Returns the lease, or NULL with a message in err (out of memory, or
 * the thread could not start).
 */
rl_lease *rl_lease_start(const rl_conn_opts *opts, rl_op extend, const char *prefix, size_t plen,
                         const char *key, size_t klen, const char *token, size_t tlen,
                         long long ttl_ms, long long delay_ms, long long max_hold_ms, long long sent_ms,
                         char err[RL_ERRLEN]);

/* The lease's state; when RL_LEASE_LOST, why (a sentence fragment) in why. */
rl_lease_state rl_lease_state_of(rl_lease *lease, char *why, size_t len);

/* The owner extended the lock to ttl_ms with a command sent at sent_ms:
   renew to that from now on. */
void rl_lease_extended(rl_lease *lease, long long ttl_ms, long long sent_ms);

/* The latest the lock can have lasted to, by the last confirmed renewal
   (monotonic ms): when renewal ended or stopped, it expires by then. */
long long rl_lease_expires(rl_lease *lease);

/* Whether a renewal of the lease is on its way now, or due. */
int rl_lease_due_now(rl_lease *lease);

/* Stops renewing and frees the lease (now, or once a renewal under way ends;
   a lease made before a fork() is only set aside in the child). With settle,
   waits for a renewal under way to end. Returns 1 when no renewal was on
   its way, or it was answered: nothing of the lease reaches the server
   after; 0 when one was, unanswered (timed out: its bytes may still be
   read by the server later, and cut back an extend sent after this). */
int rl_lease_stop(rl_lease *lease, int settle);

/*
 * A master moved (Sentinel named a new one): the leases renewed on
 * from_host:from_port are renewed on to_host:to_port from now on, at once.
 * Returns how many moved, or -1 when out of memory (those left stay).
 */
int rl_watchdog_move(const char *from_host, int from_port, const char *to_host, int to_port);

/* A Lua state loaded the module / is closing: the last one out stops the thread. */
void rl_watchdog_enter(void);
void rl_watchdog_leave(void);

#pragma GCC visibility pop

#endif
