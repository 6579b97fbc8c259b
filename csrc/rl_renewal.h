/* SPDX-License-Identifier: MIT */
/*
 * One node's lease as a machine without I/O: when its next renewal is due,
 * what a renewal's answer means (held; lost, with the one sentence that says
 * why; or tried again while the TTL lasts), the "extended meanwhile" and
 * "moved meanwhile" rules, max_hold, and when the lock expires. Its drivers
 * only move time and bytes: the watchdog thread in plain Lua
 * (rl_watchdog.c), the worker's renewal timer under OpenResty
 * (redislock/ngx_lease.lua, through core.renewal). Times are monotonic
 * milliseconds the driver reads (rl_now_ms). Not thread-safe: the watchdog
 * holds its mutex around every call.
 */
#ifndef REDISLOCK_RL_RENEWAL_H
#define REDISLOCK_RL_RENEWAL_H

#pragma GCC visibility push(hidden)

/* What a lease says of its lock. */
typedef enum {
  RL_LEASE_HELD,  /* renewed on time, as far as its renewals know */
  RL_LEASE_LOST,  /* a renewal found it gone or taken, or could not reach the
                     server before the TTL ran out */
  RL_LEASE_ENDED  /* max_hold passed, or the driver stopped: no more
                     renewals; the TTL runs out */
} rl_lease_state;

/* What the driver does next (rl_renewal_next). */
typedef enum {
  RL_RENEW_NONE,  /* nothing: not held, or a renewal is on its way */
  RL_RENEW_LATER, /* wait until r->due */
  RL_RENEW_NOW    /* send a renewal now (rl_renewal_sent first) */
} rl_renew_next;

/* What an answer meant (rl_renewal_answer). */
typedef enum {
  RL_RENEWED,     /* held; the next renewal is at r->due */
  RL_RENEW_RETRY, /* not sent or not answered; tried again at r->due, within the TTL */
  RL_RENEW_LOST,  /* lost: r->why says why */
  RL_RENEW_OVER   /* the lease ended or was lost while it was on its way */
} rl_renew_outcome;

typedef struct {
  const char *by;           /* who renews, in sentences: "the watchdog" */
  long long ttl_ms;         /* the holder's TTL: each renewal sets it (plus delay_ms) */
  long long delay_ms;       /* a lock delay: the server keeps the lock that much past the TTL */
  long long due;            /* the next renewal */
  long long confirmed;      /* when the last good renewal (or the acquire) was sent */
  long long renewed;        /* when the last renewal's answer came (0: none yet) */
  long long until;          /* no renewals from then on (0: no limit) */
  long long sent, sent_ttl; /* the renewal on its way: when it went, its TTL */
  unsigned moves, sent_moves; /* moves to another node (counted); as of the renewal on its way */
  int busy;                 /* a renewal is on its way */
  rl_lease_state state;
  char why[512];            /* when lost; last, so that init clears only what is before it */
} rl_renewal;

/* A lock acquired (or its permit, read or write hold, leadership) with TTL
   ttl_ms by a command sent at sent_ms, renewed by `by` (kept, not copied);
   max_hold_ms > 0 ends the renewals that long after now. */
void rl_renewal_init(rl_renewal *r, const char *by, long long ttl_ms, long long max_hold_ms, long long sent_ms,
                     long long now);

/* A lock delay of delay_ms > 0 (right after init): each renewal sets the
   TTL plus the delay on the server, while the lease counts the TTL alone;
   a renewal due after the TTL ran out (its driver was paused) loses the
   lease instead of going, and one answered after it loses it too: its
   holder must stop at its TTL, the delay being the others' margin. */
void rl_renewal_delay(rl_renewal *r, long long delay_ms);

/* Renew every third of the TTL (at least 1 ms); no wait of a renewal is
   longer than that either. */
long long rl_renewal_step(long long ttl_ms);

/* What to do at now; a renewal due after max_hold ends the lease instead,
   one due after a delayed lease's TTL loses it (rl_renewal_delay). */
rl_renew_next rl_renewal_next(rl_renewal *r, long long now);

/* A renewal goes out at now: returns the TTL (ms) it sets (with the lock
   delay on top). */
long long rl_renewal_sent(rl_renewal *r, long long now);

/*
 * The answer of the renewal on its way, at now: when answered, status is
 * the extend script's (rl_proto.h: RL_HELD, RL_FREE or RL_OTHER); else err
 * (a "connection: ..." or "redis: ..." message) says why it was not sent or
 * not answered. When the owner extended meanwhile, the answer only says
 * when to renew next.
 */
rl_renew_outcome rl_renewal_answer(rl_renewal *r, long long now, int answered, int status, const char *err);

/* The owner extended the lock to ttl_ms with a command sent at sent_ms;
   also after max_hold ended the renewals, so that the lease's expiry
   follows the owner's extends. */
void rl_renewal_extended(rl_renewal *r, long long ttl_ms, long long sent_ms, long long now);

/* The lock's node changed (a Sentinel switch): renew on the new one at once. */
void rl_renewal_moved(rl_renewal *r, long long now);

/* No more renewals: ended when cause is NULL, else lost because the driver
   stopped for cause ("its thread could not be restarted"). */
void rl_renewal_stop(rl_renewal *r, const char *cause);

/* The latest the lock lasts to without another renewal. */
long long rl_renewal_expires(const rl_renewal *r);

/* Whether a renewal is on its way or due at now. */
int rl_renewal_due_now(const rl_renewal *r, long long now);

#pragma GCC visibility pop

#endif
