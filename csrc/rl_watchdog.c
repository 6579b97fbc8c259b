/* SPDX-License-Identifier: MIT */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* strdup, clock_gettime under -std=c99 */
#endif
#include "rl_watchdog.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A watchdog connection, shared by the leases made with the same options.
   Only the watchdog thread does I/O on it. */
typedef struct rl_wconn {
  struct rl_wconn *next;
  rl_conn conn;       /* its timeouts are cut per renewal (see renew) */
  long long connect_timeout_ms, timeout_ms; /* as asked for, to match opts */
  int users;          /* leases using it; kept while the thread runs */
} rl_wconn;

struct rl_lease {
  rl_lease *next, *prev;
  rl_wconn *wc;
  char *names;              /* prefix, key and token, one after another */
  size_t plen, klen, tlen;
  rl_op extend;             /* the script that renews it: the lock's extend, a permit's ... */
  int stopped;              /* its owner let go: freed once its renewal is back */
  int *settled;             /* when its renewal is back after a stop: 1 answered, 2 not (wd.settle broadcast) */
  int orphan;               /* made before a fork(), seen from the child */
  rl_renewal r;             /* when to renew, what answers mean; busy: renewed without the mutex */
};

static pthread_mutex_t wd_mu = PTHREAD_MUTEX_INITIALIZER;

/* Everything in wd is guarded by wd_mu. */
static struct {
  pthread_cond_t cv; /* on CLOCK_MONOTONIC: a lease was added, changed or the thread must quit */
  pthread_cond_t settle; /* a stopped lease's renewal under way ended (rl_lease_stop's settle) */
  pthread_t thread;
  int running;       /* started and not yet joined */
  long long wake_at; /* when the sleeping thread wakes by itself (LLONG_MAX: never) */
  int quit;
  int states;        /* Lua states that loaded the module */
  rl_lease *leases;
  rl_wconn *conns;
  /* A forked child keeps its parent's leases and connections here, untouched
     (their sockets are the parent's); they stay reachable, never freed. */
  rl_lease *stale_leases;
  rl_wconn *stale_conns;
} wd;

static pthread_once_t wd_once = PTHREAD_ONCE_INIT;

/* (Re)makes the condition variables, the thread's waiting on the monotonic clock. */
static void init_cv(void) {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&wd.cv, &attr);
  pthread_condattr_destroy(&attr);
  pthread_cond_init(&wd.settle, NULL);
}

/* fork(): the mutex is held across it, so the child gets a consistent copy. */
static void before_fork(void) { pthread_mutex_lock(&wd_mu); }
static void after_fork_parent(void) { pthread_mutex_unlock(&wd_mu); }

/* In the child there is no watchdog thread, and the parent's connections and
   leases are not the child's: they are set aside, and the child starts afresh. */
static void after_fork_child(void) {
  rl_lease *l;
  rl_wconn *c;
  for (l = wd.leases; l != NULL; l = l->next) l->orphan = 1;
  if (wd.leases != NULL) {
    for (l = wd.leases; l->next != NULL; l = l->next) {}
    l->next = wd.stale_leases;
    wd.stale_leases = wd.leases;
  }
  if (wd.conns != NULL) {
    for (c = wd.conns; c->next != NULL; c = c->next) {}
    c->next = wd.stale_conns;
    wd.stale_conns = wd.conns;
  }
  wd.leases = NULL;
  wd.conns = NULL;
  wd.running = 0;
  wd.quit = 0;
  init_cv();
  pthread_mutex_unlock(&wd_mu);
}

/* Once per process: the condition variable and the fork handlers. */
static void wd_init(void) {
  init_cv();
  pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

static int same_str(const char *a, const char *b) {
  return (a == NULL || b == NULL) ? a == b : strcmp(a, b) == 0;
}

/* Whether c connects as opts asks (its own timeouts are cut per renewal). */
static int same_opts(const rl_wconn *c, const rl_conn_opts *b) {
  const rl_conn_opts *a = &c->conn.o;
  return same_str(a->host, b->host) && a->port == b->port && same_str(a->path, b->path) &&
         same_str(a->username, b->username) && same_str(a->password, b->password) &&
         a->db == b->db && rl_tls_same(a->tls, b->tls) && c->connect_timeout_ms == b->connect_timeout_ms &&
         c->timeout_ms == b->timeout_ms;
}

/* The watchdog connection for opts, made if needed (NULL when out of memory). */
static rl_wconn *conn_for(const rl_conn_opts *opts) {
  rl_wconn *c;
  for (c = wd.conns; c != NULL; c = c->next)
    if (same_opts(c, opts)) return c;
  c = (rl_wconn *)calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  if (rl_conn_init(&c->conn, opts) != 0) {
    rl_conn_free(&c->conn);
    free(c);
    return NULL;
  }
  c->connect_timeout_ms = opts->connect_timeout_ms;
  c->timeout_ms = opts->timeout_ms;
  c->next = wd.conns;
  wd.conns = c;
  return c;
}

/* Frees the connections no lease uses. Only when the thread is not running:
   while it runs it keeps them, so that a loop of short locks does not open
   a connection each. */
static void free_idle_conns(void) {
  rl_wconn **pc = &wd.conns;
  while (*pc != NULL) {
    rl_wconn *c = *pc;
    if (c->users > 0) {
      pc = &c->next;
      continue;
    }
    *pc = c->next;
    rl_conn_free(&c->conn);
    free(c);
  }
}

/* Unlinks and frees a lease that is not busy. */
static void free_lease(rl_lease *l) {
  if (l->prev != NULL) l->prev->next = l->next;
  else wd.leases = l->next;
  if (l->next != NULL) l->next->prev = l->prev;
  if (l->wc != NULL) l->wc->users--;
  if (!wd.running) free_idle_conns();
  free(l->names);
  free(l);
}

/* Cuts wc's timeouts to cap ms for one renewal: one thread renews for every
   server, and a slow one must not hold up the others past their TTLs. */
static void cap_timeouts(rl_wconn *wc, long long cap) {
  wc->conn.o.connect_timeout_ms = wc->connect_timeout_ms < cap ? wc->connect_timeout_ms : cap;
  rl_conn_set_timeout(&wc->conn, wc->timeout_ms < cap ? wc->timeout_ms : cap);
}

/* Sends l's extend (as of ttl ms) on wc. 0 with res, or -1 with err (and
   where a cluster redirected it in to). */
static int extend_on(rl_wconn *wc, const rl_lease *l, long long ttl, rl_result *res, char err[RL_ERRLEN],
                     rl_redirect_to *to) {
  const char *prefix = l->names, *key = prefix + l->plen, *token = key + l->klen;
  rl_cmd cmd;
  int rc;
  to->kind = RL_NO_REDIRECT;
  if (rl_cmd_init(&cmd, l->extend, prefix, l->plen, key, l->klen, token, l->tlen, ttl, 0) != 0) {
    snprintf(err, RL_ERRLEN, "out of memory");
    return -1;
  }
  rc = rl_conn_eval(&wc->conn, &cmd, res, err, to);
  rl_cmd_free(&cmd);
  return rc;
}

/*
 * After a renewal on wc was redirected by a cluster (rd), the watchdog
 * connection to the node rd names (with wd_mu held; NULL when there is none
 * or no memory). A MOVED moves l there for good; an ASK (the slot is being
 * moved) is for this renewal only.
 */
static rl_wconn *redirected(rl_lease *l, rl_wconn *wc, const rl_redirect_to *rd) {
  rl_conn_opts o;
  rl_wconn *to;
  if (rd->kind == RL_NO_REDIRECT || wc->conn.o.path != NULL) return NULL;
  o = wc->conn.o;
  if (rd->host[0] != '\0') o.host = (char *)rd->host; /* else the node just asked */
  o.port = rd->port;
  o.connect_timeout_ms = wc->connect_timeout_ms;
  o.timeout_ms = wc->timeout_ms;
  to = conn_for(&o);
  if (to != NULL && rd->kind == RL_MOVED) {
    wc->users--;
    to->users++;
    l->wc = to;
  }
  return to;
}

/*
 * Renews l once. Called and returns with wd_mu held; drops it for the I/O,
 * during which l's renewal is on its way (so that nobody frees l) and only
 * the watchdog thread touches l->wc. In a cluster it follows one redirect:
 * to the node a MOVED names (where the lease stays), or after an ASKING to
 * the node an ASK names.
 */
static void renew(rl_lease *l) {
  long long ttl = rl_renewal_sent(&l->r, rl_now_ms());
  char err[RL_ERRLEN];
  rl_result res;
  rl_redirect_to rd;
  int rc;
  rl_wconn *wc = l->wc, *to;
  /* No wait is longer than a renewal's step (of the holder's TTL). */
  long long cap = rl_renewal_step(l->r.ttl_ms);
  cap_timeouts(wc, cap);
  pthread_mutex_unlock(&wd_mu);
  rc = extend_on(wc, l, ttl, &res, err, &rd);
  if (rc != 0 && rd.kind != RL_NO_REDIRECT) {
    pthread_mutex_lock(&wd_mu);
    to = redirected(l, wc, &rd);
    if (to != NULL) cap_timeouts(to, cap);
    pthread_mutex_unlock(&wd_mu);
    if (to != NULL) {
      to->conn.asking = rd.kind == RL_ASK;
      rc = extend_on(to, l, ttl, &res, err, &rd);
      to->conn.asking = 0;
    }
  }
  pthread_mutex_lock(&wd_mu);
  rl_renewal_answer(&l->r, rl_now_ms(), rc == 0, rc == 0 ? res.status : 0, err);
  if (l->stopped) {
    if (l->settled != NULL) {
      *l->settled = rc == 0 ? 1 : 2;
      pthread_cond_broadcast(&wd.settle);
    }
    free_lease(l);
  }
}

/* The thread: renews each lease when it is due, sleeps until the next one. */
static void *watch(void *unused) {
  (void)unused;
  pthread_mutex_lock(&wd_mu);
  while (!wd.quit) {
    rl_lease *l, *next = NULL;
    long long now = rl_now_ms();
    rl_renew_next what = RL_RENEW_NONE;
    for (l = wd.leases; l != NULL; l = l->next)
      if (!l->stopped && l->r.state == RL_LEASE_HELD && !l->r.busy && (next == NULL || l->r.due < next->r.due))
        next = l;
    if (next != NULL) what = rl_renewal_next(&next->r, now);
    if (next == NULL) {
      wd.wake_at = LLONG_MAX;
      pthread_cond_wait(&wd.cv, &wd_mu);
    } else if (what == RL_RENEW_LATER) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      ts.tv_sec += (time_t)((next->r.due - now) / 1000);
      ts.tv_nsec += (long)((next->r.due - now) % 1000) * 1000000L;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      wd.wake_at = next->r.due;
      pthread_cond_timedwait(&wd.cv, &wd_mu, &ts);
    } else if (what == RL_RENEW_NOW) {
      wd.wake_at = 0; /* busy: it looks at the list again before sleeping */
      renew(next);
    }
  }
  pthread_mutex_unlock(&wd_mu);
  return NULL;
}

/* Wakes the thread if it would sleep past due (with wd_mu held). A busy loop
   of short locks then costs no wake-up each: the thread already sleeps until
   an earlier due than theirs. */
static void wake_for(long long due) {
  if (due < wd.wake_at) pthread_cond_signal(&wd.cv);
}

/* Starts the thread with every signal blocked: they belong to the Lua thread. */
static int start_thread(void) {
  sigset_t all, old;
  int rc;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  wd.wake_at = 0; /* it looks at the list before it first sleeps */
  rc = pthread_create(&wd.thread, NULL, watch, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc == 0) wd.running = 1;
  return rc;
}

rl_lease *rl_lease_start(const rl_conn_opts *opts, rl_op extend, const char *prefix, size_t plen,
                         const char *key, size_t klen, const char *token, size_t tlen,
                         long long ttl_ms, long long delay_ms, long long max_hold_ms, long long sent_ms,
                         char err[RL_ERRLEN]) {
  rl_lease *l = (rl_lease *)malloc(sizeof *l);
  int rc;
  pthread_once(&wd_once, wd_init);
  if (l != NULL) {
    memset(l, 0, offsetof(rl_lease, r));
    rl_renewal_init(&l->r, "the watchdog", ttl_ms, max_hold_ms, sent_ms, rl_now_ms());
    rl_renewal_delay(&l->r, delay_ms);
  }
  if (l == NULL || (l->names = (char *)malloc(plen + klen + tlen + 1)) == NULL) {
    free(l);
    snprintf(err, RL_ERRLEN, "renewal: out of memory");
    return NULL;
  }
  memcpy(l->names, prefix, plen);
  memcpy(l->names + plen, key, klen);
  memcpy(l->names + plen + klen, token, tlen);
  l->plen = plen;
  l->klen = klen;
  l->tlen = tlen;
  l->extend = extend;
  pthread_mutex_lock(&wd_mu);
  l->wc = conn_for(opts);
  if (l->wc == NULL) {
    pthread_mutex_unlock(&wd_mu);
    free(l->names);
    free(l);
    snprintf(err, RL_ERRLEN, "renewal: out of memory");
    return NULL;
  }
  l->wc->users++;
  l->next = wd.leases;
  if (wd.leases != NULL) wd.leases->prev = l;
  wd.leases = l;
  if (!wd.running && (rc = start_thread()) != 0) {
    free_lease(l);
    pthread_mutex_unlock(&wd_mu);
    snprintf(err, RL_ERRLEN, "renewal: cannot start the watchdog thread (%s)", strerror(rc));
    return NULL;
  }
  wake_for(l->r.due);
  pthread_mutex_unlock(&wd_mu);
  return l;
}

rl_lease_state rl_lease_state_of(rl_lease *l, char *why, size_t len) {
  rl_lease_state s;
  pthread_mutex_lock(&wd_mu);
  s = l->r.state;
  if (s == RL_LEASE_LOST && len > 0) snprintf(why, len, "%s", l->r.why);
  pthread_mutex_unlock(&wd_mu);
  return s;
}

void rl_lease_extended(rl_lease *l, long long ttl_ms, long long sent_ms) {
  pthread_mutex_lock(&wd_mu);
  rl_renewal_extended(&l->r, ttl_ms, sent_ms, rl_now_ms());
  if (l->r.state == RL_LEASE_HELD) wake_for(l->r.due);
  pthread_mutex_unlock(&wd_mu);
}

long long rl_lease_expires(rl_lease *l) {
  long long at;
  pthread_mutex_lock(&wd_mu);
  at = rl_renewal_expires(&l->r);
  pthread_mutex_unlock(&wd_mu);
  return at;
}

int rl_lease_due_now(rl_lease *l) {
  int due;
  pthread_mutex_lock(&wd_mu);
  due = rl_renewal_due_now(&l->r, rl_now_ms());
  pthread_mutex_unlock(&wd_mu);
  return due;
}

int rl_lease_stop(rl_lease *l, int settle) {
  int settled = 0;
  pthread_mutex_lock(&wd_mu);
  if (l->orphan) {
    l->stopped = 1; /* set aside: no thread of this process renews it */
  } else if (l->r.busy) {
    l->stopped = 1; /* on its way: renew frees it */
    if (settle) {
      /* Bounded: the renewal waits no longer than its connection timeouts, capped at a renewal's step. */
      l->settled = &settled;
      while (!settled) pthread_cond_wait(&wd.settle, &wd_mu);
    }
  } else {
    settled = 1;
    free_lease(l);
  }
  pthread_mutex_unlock(&wd_mu);
  return settled == 1;
}

int rl_watchdog_move(const char *from_host, int from_port, const char *to_host, int to_port) {
  rl_lease *l;
  int moved = 0, failed = 0;
  long long now = rl_now_ms();
  pthread_once(&wd_once, wd_init);
  pthread_mutex_lock(&wd_mu);
  for (l = wd.leases; l != NULL; l = l->next) {
    rl_wconn *from = l->wc, *to;
    rl_conn_opts o;
    if (from == NULL || l->stopped || from->conn.o.path != NULL || from->conn.o.port != from_port ||
        !same_str(from->conn.o.host, from_host))
      continue;
    o = from->conn.o;
    o.host = (char *)to_host;
    o.port = to_port;
    o.connect_timeout_ms = from->connect_timeout_ms; /* cut per renewal in from->conn.o */
    o.timeout_ms = from->timeout_ms;
    to = conn_for(&o);
    if (to == NULL) {
      failed = 1;
      continue;
    }
    /* A renewal under way on the old connection still ends there (renew
       holds its own pointer, and no connection is freed while the thread
       runs); the next one goes to the new master, now. */
    from->users--;
    to->users++;
    l->wc = to;
    rl_renewal_moved(&l->r, now);
    moved++;
  }
  if (moved > 0 && wd.running) pthread_cond_signal(&wd.cv);
  pthread_mutex_unlock(&wd_mu);
  return failed ? -1 : moved;
}

void rl_watchdog_enter(void) {
  pthread_once(&wd_once, wd_init);
  pthread_mutex_lock(&wd_mu);
  wd.states++;
  pthread_mutex_unlock(&wd_mu);
}

void rl_watchdog_leave(void) {
  int join;
  pthread_mutex_lock(&wd_mu);
  join = --wd.states == 0 && wd.running;
  if (join) {
    wd.quit = 1;
    pthread_cond_signal(&wd.cv);
  }
  pthread_mutex_unlock(&wd_mu);
  if (!join) return;
  pthread_join(wd.thread, NULL);
  pthread_mutex_lock(&wd_mu);
  wd.running = 0;
  wd.quit = 0;
  /* A state in another thread may have started a lease meanwhile. */
  if (wd.leases != NULL && start_thread() != 0) {
    rl_lease *l;
    for (l = wd.leases; l != NULL; l = l->next)
      rl_renewal_stop(&l->r, "its thread could not be restarted");
  }
  if (!wd.running) free_idle_conns();
  pthread_mutex_unlock(&wd_mu);
}
