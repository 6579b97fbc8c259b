/* SPDX-License-Identifier: MIT */
/* One lock script on several connections at once (rl_conn_eval_many, for
   Redlock): a call state machine per connection (rl_call.h), all sent,
   then every reply read as it comes, one poll() over all the sockets. */
#include "rl_conn.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* A call's I/O failed (timeout: it timed out): why, then what the call does. */
static rl_step lost(rl_conn *conn, rl_call *call, int eof, int timeout) {
  return rl_conn_lost(conn, call, eof, timeout, conn->o.timeout_ms);
}

/*
 * Moves a call on until it waits for replies (RL_STEP_READ) or ends: its
 * bytes written at once, another connection opened when it asks (bounded
 * by the connect timeout).
 */
static rl_step advance(rl_conn *conn, rl_call *call, rl_step step) {
  for (;;) {
    size_t len;
    const char *bytes;
    switch (step) {
    case RL_STEP_SEND:
      bytes = rl_call_bytes(call, &len);
      if (rl_conn_io_timeout(conn, rl_call_read_ms(call)) != 0 || rl_conn_write(conn, bytes, len) != 0) {
        step = lost(conn, call, 0, errno == EAGAIN || errno == EWOULDBLOCK);
        break;
      }
      return RL_STEP_READ;
    case RL_STEP_RECONNECT:
      rl_conn_close(conn);
      if (rl_conn_open(conn, call->err) != 0) return RL_STEP_FAILED;
      step = rl_call_start(call, 0, conn->reader);
      break;
    default:
      return step;
    }
  }
}

/* One read on a connection whose socket is readable, fed to its call. */
static rl_step many_read(rl_conn *conn, rl_call *call, long long left_ms) {
  char in[4096];
  ssize_t n;
  /* TLS may need the rest of a record: never longer than the time left. */
  if (rl_conn_io_timeout(conn, left_ms) != 0) return advance(conn, call, lost(conn, call, 0, 0));
  do n = conn->ssl != NULL ? rl_tls_read(conn->ssl, in, sizeof in) : recv(conn->fd, in, sizeof in, 0);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return advance(conn, call, lost(conn, call, n == 0, n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)));
  conn->answered = 1;
  return advance(conn, call, rl_call_feed(call, in, (size_t)n));
}

void rl_conn_eval_many(rl_conn *const *conns, rl_cmd *const *cmds, int n, long long timeout_ms,
                       rl_result *out, int *rc, char (*err)[RL_ERRLEN]) {
  long long deadline = rl_now_ms() + timeout_ms;
  struct pollfd p[RL_MANY_MAX];
  rl_step step[RL_MANY_MAX];
  int at[RL_MANY_MAX], pending = 0, i;
  rl_call *calls;
  if (n > RL_MANY_MAX) n = RL_MANY_MAX;
  calls = (rl_call *)malloc(sizeof *calls * (size_t)(n > 0 ? n : 1));
  if (calls == NULL) {
    for (i = 0; i < n; i++) {
      rc[i] = -1;
      snprintf(err[i], RL_ERRLEN, "connection: out of memory");
    }
    return;
  }
  for (i = 0; i < n; i++) {
    rl_conn *c = conns[i];
    int reused;
    rl_call_init(&calls[i], cmds[i]);
    rl_conn_set_timeout(c, timeout_ms);
    reused = rl_conn_begin(c, calls[i].err);
    if (reused < 0) {
      step[i] = RL_STEP_FAILED;
      continue;
    }
    calls[i].timeout_ms = timeout_ms;
    calls[i].where = c->where;
    step[i] = advance(c, &calls[i], rl_call_start(&calls[i], reused, c->reader));
  }
  for (;;) {
    int k = 0, buffered = 0, ready;
    long long left = deadline - rl_now_ms();
    for (pending = 0, i = 0; i < n; i++) {
      if (step[i] != RL_STEP_READ) continue;
      pending++;
      if (left <= 0) {
        step[i] = lost(conns[i], &calls[i], 0, 1);
      } else if (conns[i]->ssl != NULL && rl_tls_pending(conns[i]->ssl) > 0) {
        p[k].fd = -1; /* TLS has bytes already: read below, without waiting */
        p[k].revents = POLLIN;
        at[k++] = i;
        buffered = 1;
      } else {
        p[k].fd = conns[i]->fd;
        p[k].events = POLLIN;
        p[k].revents = 0;
        at[k++] = i;
      }
    }
    if (pending == 0 || k == 0) break;
    if (!buffered) {
      ready = poll(p, (nfds_t)k, (int)(left > 60000 ? 60000 : left));
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) {
        for (int j = 0; j < k; j++) step[at[j]] = advance(conns[at[j]], &calls[at[j]], lost(conns[at[j]], &calls[at[j]], 0, 0));
        continue;
      }
    }
    for (int j = 0; j < k; j++) {
      if (p[j].revents != 0) step[at[j]] = many_read(conns[at[j]], &calls[at[j]], deadline - rl_now_ms());
    }
  }
  for (i = 0; i < n; i++) {
    if (!rl_call_keep(&calls[i])) rl_conn_close(conns[i]);
    rc[i] = step[i] == RL_STEP_DONE ? 0 : -1;
    out[i] = calls[i].out;
    if (rc[i] != 0) memcpy(err[i], calls[i].err, RL_ERRLEN);
    rl_call_free(&calls[i]);
  }
  free(calls);
}
