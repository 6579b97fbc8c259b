/* SPDX-License-Identifier: MIT */
#include "rl_renewal.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "rl_proto.h"

void rl_renewal_init(rl_renewal *r, const char *by, long long ttl_ms, long long max_hold_ms, long long sent_ms,
                     long long now) {
  memset(r, 0, offsetof(rl_renewal, why)); /* not the 512 bytes of why: one per lock taken */
  r->why[0] = '\0';
  r->by = by;
  r->ttl_ms = ttl_ms;
  r->confirmed = sent_ms; /* the TTL started after the acquire was sent */
  r->due = sent_ms + rl_renewal_step(ttl_ms);
  r->until = max_hold_ms > 0 ? now + max_hold_ms : 0;
  r->state = RL_LEASE_HELD;
}

void rl_renewal_delay(rl_renewal *r, long long delay_ms) {
  r->delay_ms = delay_ms;
}

long long rl_renewal_step(long long ttl_ms) {
  return ttl_ms / 3 > 0 ? ttl_ms / 3 : 1;
}

/* After a failed renewal, the next try comes a tenth of the TTL later, from
   10 ms to a second. */
static long long retry_of(long long ttl_ms) {
  return ttl_ms / 10 < 10 ? 10 : ttl_ms / 10 > 1000 ? 1000 : ttl_ms / 10;
}

/* Lost: no more renewals; why says why, in one sentence fragment. */
static rl_renew_outcome lose(rl_renewal *r, const char *why, const char *err) {
  r->state = RL_LEASE_LOST;
  if (err != NULL) snprintf(r->why, sizeof r->why, "%s %s: %.400s", r->by, why, err);
  else snprintf(r->why, sizeof r->why, "%s; found by %s", why, r->by);
  return RL_RENEW_LOST;
}

/* Whether a delayed lease's TTL ran out by now: the server keeps the lock
   for its delay, but its holder counts it lost, and a renewal then would
   let a holder that was paused carry on unseen. */
static int late(const rl_renewal *r, long long now) {
  return r->delay_ms > 0 && now >= r->confirmed + r->ttl_ms;
}

rl_renew_next rl_renewal_next(rl_renewal *r, long long now) {
  if (r->state != RL_LEASE_HELD || r->busy) return RL_RENEW_NONE;
  if (r->due > now) return RL_RENEW_LATER;
  if (r->until > 0 && now >= r->until) {
    r->state = RL_LEASE_ENDED; /* max_hold: the TTL runs out from here */
    return RL_RENEW_NONE;
  }
  if (late(r, now)) {
    lose(r, "its TTL ran out before it could be renewed (paused?); the lock delay keeps others out", NULL);
    return RL_RENEW_NONE;
  }
  return RL_RENEW_NOW;
}

long long rl_renewal_sent(rl_renewal *r, long long now) {
  r->busy = 1;
  r->sent = now;
  r->sent_ttl = r->ttl_ms;
  r->sent_moves = r->moves;
  return r->ttl_ms + r->delay_ms;
}


rl_renew_outcome rl_renewal_answer(rl_renewal *r, long long now, int answered, int status, const char *err) {
  int held = answered && status == RL_HELD;
  r->busy = 0;
  r->renewed = now;
  if (r->state != RL_LEASE_HELD) return RL_RENEW_OVER;
  if (r->ttl_ms != r->sent_ttl) {
    /* Extended by its owner meanwhile. This renewal may have landed after
       the owner's extend and cut the TTL back to the old one: renew with
       the new TTL at once. */
    if (held) r->due = now;
    return RL_RENEWED;
  }
  if (held && late(r, now))
    return lose(r, "its TTL ran out before its renewal came back (paused?); the lock delay keeps others out", NULL);
  if (held) {
    r->confirmed = r->sent;
    /* Moved to a new node (rl_renewal_moved) while this renewal was on its
       way to the old one: once more, on the new one, at once. */
    r->due = r->moves != r->sent_moves ? now : r->sent + rl_renewal_step(r->ttl_ms);
    return RL_RENEWED;
  }
  if (answered)
    return lose(r, status == RL_OTHER ? "another owner holds it now" : "it expired or was deleted", NULL);
  if (now >= r->confirmed + r->ttl_ms) return lose(r, "could not renew it before its TTL ran out", err);
  /* Try again soon, while the lock still has time left. */
  r->due = now + retry_of(r->ttl_ms);
  return RL_RENEW_RETRY;
}

void rl_renewal_extended(rl_renewal *r, long long ttl_ms, long long sent_ms, long long now) {
  if (r->state == RL_LEASE_LOST) return;
  r->ttl_ms = ttl_ms;
  r->confirmed = sent_ms;
  if (r->state != RL_LEASE_HELD) return; /* ended (max_hold): it expires by this extend, unrenewed */
  /* A renewal on its way, or answered since the extend went out, may have
     landed after it (another connection) and cut the TTL back to the old
     one: renew with the new TTL at once. (One still on its way does so
     itself once its answer sees the new TTL.) */
  r->due = r->busy || r->renewed >= sent_ms ? now : sent_ms + rl_renewal_step(ttl_ms);
}

void rl_renewal_moved(rl_renewal *r, long long now) {
  r->moves++;
  if (r->state == RL_LEASE_HELD && !r->busy) r->due = now;
}

void rl_renewal_stop(rl_renewal *r, const char *cause) {
  if (r->state != RL_LEASE_HELD) return;
  if (cause == NULL) {
    r->state = RL_LEASE_ENDED;
  } else {
    r->state = RL_LEASE_LOST;
    snprintf(r->why, sizeof r->why, "%s stopped: %.400s", r->by, cause);
  }
}

long long rl_renewal_expires(const rl_renewal *r) {
  return r->confirmed + r->ttl_ms;
}

int rl_renewal_due_now(const rl_renewal *r, long long now) {
  return r->busy || r->due <= now;
}
