/* SPDX-License-Identifier: MIT */
/* One lock script on several connections at once (rl_conn_eval_many, for
   Redlock): all sent, then every reply read as it comes, one poll() over
   all the sockets. */
#include "rl_conn.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>

/* rl_conn_eval_many's states of a connection. */
enum { MANY_DONE = 0, MANY_FAILED = -1, MANY_PENDING = 1, MANY_NOSCRIPT = 2 };

/* Decodes a reply to the script sent on connection i (see rl_conn_eval_many). */
static void many_decode(redisReply *r, rl_result *out, int *rc, char err[RL_ERRLEN]) {
  char msg[RL_ERRLEN - 8];
  rl_decoded d = rl_decode(r, out, msg, sizeof msg);
  freeReplyObject(r);
  if (d == RL_DECODED) {
    *rc = MANY_DONE;
  } else if (d == RL_NOSCRIPT) {
    *rc = MANY_NOSCRIPT;
  } else {
    snprintf(err, RL_ERRLEN, "redis: %s", msg);
    *rc = MANY_FAILED;
  }
}

/* One read on a connection whose socket is readable, into its reader; 0, or
   -1 with err and the connection closed. */
static int many_read(rl_conn *conn, long long left_ms, long long timeout_ms, char err[RL_ERRLEN]) {
  char in[4096];
  ssize_t n;
  /* TLS may need the rest of a record: never longer than the time left. */
  if (rl_conn_io_timeout(conn, left_ms) != 0) {
    rl_conn_io_error(conn, 0, 0, timeout_ms, err);
    return -1;
  }
  do n = conn->ssl != NULL ? rl_tls_read(conn->ssl, in, sizeof in) : recv(conn->fd, in, sizeof in, 0);
  while (n < 0 && errno == EINTR);
  if (n <= 0) {
    int timeout = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    rl_conn_io_error(conn, n == 0, timeout, timeout_ms, err);
    return -1;
  }
  conn->answered = 1;
  if (redisReaderFeed(conn->reader, in, (size_t)n) != REDIS_OK) {
    snprintf(err, RL_ERRLEN, "connection: out of memory");
    rl_conn_close(conn);
    return -1;
  }
  return 0;
}

void rl_conn_eval_many(rl_conn *const *conns, rl_cmd *const *cmds, int n, long long timeout_ms,
                       rl_result *out, int *rc, char (*err)[RL_ERRLEN]) {
  long long deadline = rl_now_ms() + timeout_ms;
  struct pollfd p[RL_MANY_MAX];
  int at[RL_MANY_MAX], pending = 0, i;
  if (n > RL_MANY_MAX) n = RL_MANY_MAX;
  for (i = 0; i < n; i++) {
    rl_conn *c = conns[i];
    /* A socket the server closed while idle, or a parent's: a fresh one. */
    if (c->fd >= 0 && (c->gen != rl_fork_gen() || rl_conn_went_away(c))) rl_conn_close(c);
    rl_conn_set_timeout(c, timeout_ms);
    rc[i] = rl_conn_send(c, cmds[i]->argc, cmds[i]->argv, cmds[i]->len, err[i]) == 0 ? MANY_PENDING : MANY_FAILED;
    if (rc[i] == MANY_PENDING) pending++;
  }
  while (pending > 0) {
    int k = 0, buffered = 0, ready;
    long long left;
    for (i = 0; i < n; i++) {
      void *r = NULL;
      if (rc[i] != MANY_PENDING) continue;
      if (redisReaderGetReply(conns[i]->reader, &r) != REDIS_OK) {
        char where[128];
        rl_conn_describe(conns[i], where, sizeof where);
        rl_read_error(conns[i]->reader->err, conns[i]->reader->errstr, where, err[i], RL_ERRLEN);
        rl_conn_close(conns[i]);
        rc[i] = MANY_FAILED;
      } else if (r != NULL) {
        many_decode((redisReply *)r, &out[i], &rc[i], err[i]);
        /* Bytes past the reply were asked for by no command. */
        if (conns[i]->reader->pos < conns[i]->reader->len) rl_conn_close(conns[i]);
      } else {
        continue;
      }
      pending--;
    }
    if (pending == 0) break;
    left = deadline - rl_now_ms();
    for (i = 0; i < n; i++) {
      if (rc[i] != MANY_PENDING) continue;
      if (left <= 0) {
        errno = EAGAIN;
        rl_conn_io_error(conns[i], 0, 1, timeout_ms, err[i]);
        rc[i] = MANY_FAILED;
        pending--;
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
    if (pending == 0) break;
    if (!buffered) {
      ready = poll(p, (nfds_t)k, (int)(left > 60000 ? 60000 : left));
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) {
        for (int j = 0; j < k; j++) {
          rl_conn_io_error(conns[at[j]], 0, 0, timeout_ms, err[at[j]]);
          rc[at[j]] = MANY_FAILED;
        }
        break;
      }
    }
    for (int j = 0; j < k; j++) {
      if (p[j].revents == 0) continue;
      if (many_read(conns[at[j]], deadline - rl_now_ms(), timeout_ms, err[at[j]]) != 0) {
        rc[at[j]] = MANY_FAILED;
        pending--;
      }
    }
  }
  /* NOSCRIPT (a server's first use, or after SCRIPT FLUSH): EVAL, one by one. */
  for (i = 0; i < n; i++) {
    if (rc[i] != MANY_NOSCRIPT) continue;
    rl_cmd_use_eval(cmds[i]);
    rc[i] = rl_conn_eval(conns[i], cmds[i], &out[i], err[i]) == 0 ? MANY_DONE : MANY_FAILED;
  }
}

