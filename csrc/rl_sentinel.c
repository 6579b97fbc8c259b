/* SPDX-License-Identifier: MIT */
/* The Sentinel watch: a +switch-master subscription on a thread of its own. */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* strdup, pipe2 under -std=c99 */
#endif
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2 */
#endif
#include "rl_sentinel.h"
#include "rl_watchdog.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define IDLE_MS 1000  /* with nothing heard for this long, a PING checks the sentinel */
#define RETRY_MS 200  /* between one sentinel failing and asking the next */

struct rl_sentinel_watch {
  rl_conn *conns;      /* one per sentinel, used by the thread only */
  int n;
  char *master;
  unsigned long count; /* read and bumped with atomics */
  pthread_mutex_t mu;  /* guards the three below (the thread writes, rl_sentinel_watch_heard reads) */
  char to[256];        /* the master the last switch heard announced */
  int to_port;
  unsigned long at;    /* the count that switch left (0: none heard) */
  int wake[2];         /* a byte written to wake[1] stops the thread */
  pthread_t thread;
  int running;         /* a thread of this process runs (joined by stop) */
  unsigned gen;        /* rl_fork_gen() of the process that started it */
};

static unsigned long bump(rl_sentinel_watch *w) { return __atomic_add_fetch(&w->count, 1, __ATOMIC_SEQ_CST); }

/* Sleeps ms, or less when woken. 1 when woken (the thread must stop). */
static int pause_or_wake(rl_sentinel_watch *w, int ms) {
  return rl_wait_fd(w->wake[0], POLLIN, rl_now_ms() + ms) > 0;
}

/* The i-th element of an array reply as a string, or NULL. */
static const char *elem_str(const redisReply *r, size_t i) {
  if (r->type != REDIS_REPLY_ARRAY || i >= r->elements) return NULL;
  r = r->element[i];
  return r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ? r->str : NULL;
}

/*
 * A published "+switch-master" message for our master: "<name> <old ip>
 * <old port> <new ip> <new port>". Moves the watchdog's renewals, counts
 * it and keeps the new master's address with the count it left. Other
 * replies (the PONG of a PING, other masters) change nothing.
 */
static void heard(rl_sentinel_watch *w, const redisReply *r) {
  const char *kind = elem_str(r, 0), *text = elem_str(r, 2);
  char name[256], from[256], to[256];
  int from_port, to_port;
  if (kind == NULL || text == NULL || strcmp(kind, "message") != 0) return;
  if (sscanf(text, "%255s %255s %d %255s %d", name, from, &from_port, to, &to_port) != 5) return;
  if (strcmp(name, w->master) != 0) return;
  rl_watchdog_move(from, from_port, to, to_port);
  pthread_mutex_lock(&w->mu);
  memcpy(w->to, to, sizeof w->to);
  w->to_port = to_port;
  w->at = bump(w);
  pthread_mutex_unlock(&w->mu);
}

/*
 * Stays subscribed on conn until it fails (0) or the watch is stopped (1).
 * Counts the subscription once made: a switch may have come before it.
 */
static int listen_on(rl_sentinel_watch *w, rl_conn *conn) {
  static const char *const sub[] = { "SUBSCRIBE", "+switch-master" };
  static const size_t sub_len[] = { 9, 14 };
  static const char *const ping[] = { "PING" };
  static const size_t ping_len[] = { 4 };
  char err[RL_ERRLEN];
  redisReply *r = NULL;
  int rc, idle = 0;
  if (rl_conn_send(conn, 2, (const char **)sub, sub_len, err) != 0) return 0;
  rc = rl_conn_read_reply(conn, conn->o.timeout_ms, w->wake[0], &r, err);
  if (rc == RL_READ_WOKEN) return 1;
  if (rc != RL_READ_REPLY) {
    rl_conn_close(conn);
    return 0;
  }
  rc = elem_str(r, 0) != NULL && strcmp(elem_str(r, 0), "subscribe") == 0;
  freeReplyObject(r);
  if (!rc) { /* an error (NOAUTH, no such command): not a sentinel we can use */
    rl_conn_close(conn);
    return 0;
  }
  bump(w);
  for (;;) {
    rc = rl_conn_read_reply(conn, IDLE_MS, w->wake[0], &r, err);
    if (rc == RL_READ_WOKEN) return 1;
    if (rc == RL_READ_FAILED) return 0;
    if (rc == RL_READ_REPLY) {
      heard(w, r);
      freeReplyObject(r);
      idle = 0;
      continue;
    }
    /* Nothing for a while: a PING, answered within the next wait, or the
       sentinel is gone without a word (a cut network, a paused host). */
    if (idle++ > 0 || rl_conn_send(conn, 1, (const char **)ping, ping_len, err) != 0) {
      rl_conn_close(conn);
      return 0;
    }
  }
}

static void *watch_main(void *arg) {
  rl_sentinel_watch *w = (rl_sentinel_watch *)arg;
  int i = 0;
  for (;;) {
    if (listen_on(w, &w->conns[i])) break;
    bump(w); /* not subscribed now: a switch may go unheard */
    i = (i + 1) % w->n;
    if (pause_or_wake(w, RETRY_MS)) break;
  }
  for (i = 0; i < w->n; i++) rl_conn_close(&w->conns[i]);
  return NULL;
}

/* Starts the thread (a new wake pipe first), with every signal blocked. 0 or an errno. */
static int start(rl_sentinel_watch *w) {
  sigset_t all, old;
  int rc;
  if (pipe2(w->wake, O_CLOEXEC) != 0) return errno;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  rc = pthread_create(&w->thread, NULL, watch_main, w);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    close(w->wake[0]);
    close(w->wake[1]);
    w->wake[0] = w->wake[1] = -1;
    return rc;
  }
  w->running = 1;
  w->gen = rl_fork_gen();
  return 0;
}

static void free_watch(rl_sentinel_watch *w) {
  int i;
  pthread_mutex_destroy(&w->mu);
  for (i = 0; w->conns != NULL && i < w->n; i++) rl_conn_free(&w->conns[i]);
  free(w->conns);
  free(w->master);
  free(w);
}

rl_sentinel_watch *rl_sentinel_watch_start(const rl_conn_opts *opts, int n, const char *master,
                                           char err[RL_ERRLEN]) {
  rl_sentinel_watch *w = (rl_sentinel_watch *)calloc(1, sizeof *w);
  int i, failed = w == NULL, rc;
  if (w != NULL) {
    w->wake[0] = w->wake[1] = -1;
    pthread_mutex_init(&w->mu, NULL);
    w->conns = (rl_conn *)calloc((size_t)n, sizeof *w->conns);
    w->master = strdup(master);
    failed = w->conns == NULL || w->master == NULL;
    for (i = 0; !failed && i < n; i++) {
      w->n = i + 1; /* free_watch frees this one too */
      failed = rl_conn_init(&w->conns[i], &opts[i]) != 0;
    }
  }
  if (failed) {
    if (w != NULL) free_watch(w);
    snprintf(err, RL_ERRLEN, "sentinel: out of memory");
    return NULL;
  }
  rc = start(w);
  if (rc != 0) {
    free_watch(w);
    snprintf(err, RL_ERRLEN, "sentinel: cannot start the watch thread (%s)", strerror(rc));
    return NULL;
  }
  return w;
}

unsigned long rl_sentinel_watch_count(rl_sentinel_watch *w) {
  if (w->gen != rl_fork_gen()) {
    /* A forked child: the thread and the pipe are the parent's. Its own
       thread, when it can start one; the count moves on either way, so that
       the child asks the sentinels itself. */
    w->running = 0;
    w->wake[0] = w->wake[1] = -1;
    pthread_mutex_init(&w->mu, NULL); /* the parent's thread may have held it at the fork */
    if (start(w) != 0) w->gen = rl_fork_gen();
    bump(w);
  }
  return __atomic_load_n(&w->count, __ATOMIC_SEQ_CST);
}

int rl_sentinel_watch_heard(rl_sentinel_watch *w, char host[256]) {
  int port = 0;
  if (w->gen != rl_fork_gen()) return 0; /* a child that has not counted yet (it asks the sentinels) */
  pthread_mutex_lock(&w->mu);
  if (w->at != 0 && w->at == __atomic_load_n(&w->count, __ATOMIC_SEQ_CST)) {
    memcpy(host, w->to, sizeof w->to);
    port = w->to_port;
  }
  pthread_mutex_unlock(&w->mu);
  return port;
}

void rl_sentinel_watch_stop(rl_sentinel_watch *w) {
  if (w->running && w->gen == rl_fork_gen()) {
    ssize_t n;
    do n = write(w->wake[1], "x", 1);
    while (n < 0 && errno == EINTR);
    pthread_join(w->thread, NULL);
    close(w->wake[0]);
    close(w->wake[1]);
  } else if (w->running) {
    /* the parent's thread: not ours to stop, and its connections are the
       parent's (left open, as the watchdog leaves its leases) */
    return;
  }
  free_watch(w);
}
