/* SPDX-License-Identifier: MIT */
/* The blocking transport over sockets of its own (TCP, unix, TLS). */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* strdup, getaddrinfo under -std=c99 */
#endif
#include "rl_conn.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#ifdef __linux__
#include <linux/tcp.h> /* TCP_INFO's tcpi_bytes_acked, which glibc's netinet/tcp.h lacks */
#else
#include <netinet/tcp.h>
#endif
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

/* strdup that lets NULL through and records a failed allocation in *failed. */
static char *dup_or_null(const char *s, int *failed) {
  char *d;
  if (s == NULL) return NULL;
  d = strdup(s);
  if (d == NULL) *failed = 1;
  return d;
}

int rl_conn_init(rl_conn *conn, const rl_conn_opts *opts) {
  int failed = 0;
  memset(conn, 0, sizeof *conn);
  conn->fd = -1;
  conn->whole = 1;
  conn->o = *opts;
  conn->o.host = dup_or_null(opts->host, &failed);
  conn->o.path = dup_or_null(opts->path, &failed);
  conn->o.username = dup_or_null(opts->username, &failed);
  conn->o.password = dup_or_null(opts->password, &failed);
  conn->o.tls = rl_tls_ref(opts->tls);
  rl_conn_describe(conn, conn->where, sizeof conn->where);
  return failed ? -1 : 0;
}

void rl_conn_close(rl_conn *conn) {
  /* Only close(2): nothing is sent (no QUIT, no close_notify), so a forked
     child may close its parent's connection without disturbing it. */
  if (conn->ssl != NULL) rl_tls_free(conn->ssl);
  if (conn->fd >= 0) close(conn->fd);
  if (conn->reader != NULL) redisReaderFree(conn->reader);
  conn->ssl = NULL;
  conn->fd = -1;
  conn->reader = NULL;
  conn->rcv_ms = 0;
  conn->out = 0;
  conn->whole = 1;
  conn->answered = 0;
}

void rl_conn_free(rl_conn *conn) {
  rl_conn_close(conn);
  free(conn->o.host);
  free(conn->o.path);
  free(conn->o.username);
  if (conn->o.password != NULL) {
    memset(conn->o.password, 0, strlen(conn->o.password));
    free(conn->o.password);
  }
  rl_tls_unref(conn->o.tls);
  memset(&conn->o, 0, sizeof conn->o);
}

void rl_conn_describe(const rl_conn *conn, char *buf, size_t len) {
  if (conn->o.path != NULL)
    snprintf(buf, len, "unix:%s", conn->o.path);
  else if (conn->o.host != NULL && strchr(conn->o.host, ':') != NULL)
    snprintf(buf, len, "[%s]:%d", conn->o.host, conn->o.port);
  else
    snprintf(buf, len, "%s:%d", conn->o.host ? conn->o.host : "?", conn->o.port);
}

/* Milliseconds as a struct timeval. */
static struct timeval ms_to_tv(long long ms) {
  struct timeval tv;
  tv.tv_sec = (time_t)(ms / 1000);
  tv.tv_usec = (suseconds_t)((ms % 1000) * 1000);
  return tv;
}

/* Sets how long a read or write on the open socket may block. 0 or -1. */
int rl_conn_io_timeout(rl_conn *conn, long long ms) {
  struct timeval tv = ms_to_tv(ms < 1 ? 1 : ms);
  if (conn->rcv_ms == ms) return 0;
  if (setsockopt(conn->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      setsockopt(conn->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
    return -1;
  conn->rcv_ms = ms;
  return 0;
}

#ifdef __linux__
/* The bytes the connection's socket took: TLS counts its records. */
static unsigned long long written(const rl_conn *conn) {
  return conn->ssl != NULL ? rl_tls_written(conn->ssl) : conn->out;
}
#endif

/*
 * Whether the server cannot have read the last bytes written on conn whole,
 * asked once the connection failed (not timed out): they did not all go
 * out (a unix socket's write to a closed peer fails), or, over TCP on
 * Linux, the server's end did not acknowledge them all. A server reads only
 * what its kernel took, which acknowledges it (at the latest with the FIN
 * of a close that follows); a server that had closed the connection before
 * they came answers them with a reset, which acknowledges nothing. So a
 * connection closed while idle (the server's timeout, CLIENT KILL, a
 * restart) is told after the fact, without a poll(2) before every command.
 */
static int untaken(const rl_conn *conn) {
  if (!conn->whole) return 1;
#ifdef __linux__
  if (conn->o.path == NULL) {
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(conn->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
        len >= offsetof(struct tcp_info, tcpi_bytes_acked) + sizeof ti.tcpi_bytes_acked)
      return ti.tcpi_bytes_acked < written(conn) + 1; /* the SYN counts one */
  }
#endif
  return 0;
}

/*
 * Where a closed connection cannot be told after the fact (TCP on other
 * systems than Linux; a unix socket's write to a closed peer fails): whether
 * the idle connection can no longer be used. Between commands the server
 * sends nothing, so a readable socket means it closed the connection or
 * sent bytes no command asked for.
 */
static int went_away(const rl_conn *conn) {
#ifdef __linux__
  (void)conn;
  return 0;
#else
  struct pollfd p;
  if (conn->o.path != NULL) return 0;
  if (conn->ssl != NULL && rl_tls_pending(conn->ssl) > 0) return 1;
  p.fd = conn->fd;
  p.events = POLLIN;
  p.revents = 0;
  return poll(&p, 1, 0) > 0;
#endif
}

/*
 * A non-blocking socket connected to addr by deadline_ms, or -1 with errno
 * (ETIMEDOUT when the deadline passed).
 */
static int connect_addr(const struct sockaddr *addr, socklen_t alen, long long deadline_ms) {
  int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), rc, soerr = 0;
  socklen_t slen = sizeof soerr;
  if (fd < 0) return -1;
  do rc = connect(fd, addr, alen);
  while (rc != 0 && errno == EINTR);
  if (rc != 0 && errno != EINPROGRESS && errno != EAGAIN) goto fail;
  if (rc != 0) {
    rc = rl_wait_fd(fd, POLLOUT, deadline_ms);
    if (rc == 0) errno = ETIMEDOUT;
    if (rc <= 0) goto fail;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &slen) != 0) goto fail;
    if (soerr != 0) {
      errno = soerr;
      goto fail;
    }
  }
  return fd;
fail:
  soerr = errno;
  close(fd);
  errno = soerr;
  return -1;
}

/* Connects the socket (TCP to every address of the host in turn, or unix). 0 or -1 and err. */
static int open_socket(rl_conn *conn, const char *where, long long deadline_ms, char err[RL_ERRLEN]) {
  if (conn->o.path != NULL) {
    struct sockaddr_un sun;
    memset(&sun, 0, sizeof sun);
    sun.sun_family = AF_UNIX;
    if (strlen(conn->o.path) >= sizeof sun.sun_path) {
      snprintf(err, RL_ERRLEN, "connection: cannot connect to %s (the path is too long)", where);
      return -1;
    }
    memcpy(sun.sun_path, conn->o.path, strlen(conn->o.path));
    conn->fd = connect_addr((struct sockaddr *)&sun, sizeof sun, deadline_ms);
  } else {
    struct addrinfo hints, *list = NULL, *ai;
    char port[8];
    int rc, one = 1, e = 0;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port, sizeof port, "%d", conn->o.port);
    rc = getaddrinfo(conn->o.host, port, &hints, &list);
    if (rc != 0) {
      snprintf(err, RL_ERRLEN, "connection: cannot connect to %s (%s)", where,
               rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
      return -1;
    }
    for (ai = list; ai != NULL && conn->fd < 0; ai = ai->ai_next) {
      conn->fd = connect_addr(ai->ai_addr, ai->ai_addrlen, deadline_ms);
      if (conn->fd < 0) e = errno;
      if (e == ETIMEDOUT) break;
    }
    freeaddrinfo(list);
    errno = e;
    if (conn->fd >= 0) {
      int idle = 15, intvl = 5, cnt = 3; /* as hiredis: a dead peer shows in ~30 s */
      setsockopt(conn->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      setsockopt(conn->fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
      setsockopt(conn->fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
      setsockopt(conn->fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
      setsockopt(conn->fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    }
  }
  if (conn->fd < 0) {
    if (errno == ETIMEDOUT)
      snprintf(err, RL_ERRLEN, "connection: cannot connect to %s (timed out after %g s)", where,
               (double)conn->o.connect_timeout_ms / 1000.0);
    else
      snprintf(err, RL_ERRLEN, "connection: cannot connect to %s (%s)", where, strerror(errno));
    return -1;
  }
  return 0;
}

/* Switches the socket between non-blocking (connect, handshake) and blocking with timeouts. */
static int set_blocking(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
}

/* Describes why a round trip failed (errno from the read or write, or eof) into err. */
void rl_conn_io_error(rl_conn *conn, int eof, int timeout, long long timeout_ms, char err[RL_ERRLEN]) {
  char why[256];
  const char *where = conn->where;
  int e = errno;
  if (timeout)
    rl_io_message(RL_IO_TIMEOUT, where, NULL, timeout_ms, err, RL_ERRLEN);
  else if (!conn->answered && conn->o.tls == NULL && conn->o.path == NULL && (eof || e == ECONNRESET))
    /* A TLS port ends a connection whose first bytes are not a handshake. */
    snprintf(err, RL_ERRLEN, "connection: %s closed the connection before any answer"
             " (a TLS port? use rediss:// or tls = true)", where);
  else if (!conn->answered && conn->ssl != NULL && (eof || e == ECONNRESET || e == EPIPE || e == EPROTO)) {
    /* A TLS 1.3 server checks our certificate after the handshake: its
       refusal is the first answer, or (when our command crossed it) a reset. */
    if (e == EPROTO && !eof) rl_tls_error(why, sizeof why);
    else snprintf(why, sizeof why, "the server ended the connection after the handshake");
    snprintf(err, RL_ERRLEN, "connection: cannot connect to %s (TLS: %s%s)", where, why,
             rl_tls_cert_requested(conn->ssl) && strstr(why, "client certificate") == NULL
                 ? "; it asked for a client certificate and none is set: tls.cert and tls.key"
                 : "");
  } else if (eof) {
    rl_io_message(RL_IO_CLOSED, where, NULL, 0, err, RL_ERRLEN);
  } else if (e == EPROTO && conn->ssl != NULL) {
    char tls[sizeof why + 8];
    rl_tls_error(why, sizeof why);
    snprintf(tls, sizeof tls, "TLS: %s", why);
    rl_io_message(RL_IO_LOST, where, tls, 0, err, RL_ERRLEN);
  } else {
    rl_io_message(RL_IO_LOST, where, strerror(e), 0, err, RL_ERRLEN);
  }
  rl_conn_close(conn);
}

/* The message for a command that could not be formatted; returns -1. */
static int format_failed(char err[RL_ERRLEN]) {
  snprintf(err, RL_ERRLEN, "connection: cannot format the command (out of memory)");
  return -1;
}

/* Writes all of buf. 0, or -1 with errno (EAGAIN: the send timeout ran out). */
int rl_conn_write(rl_conn *conn, const char *buf, size_t len) {
  conn->whole = 0;
  conn->sends++;
  while (len > 0) {
    ssize_t n = conn->ssl != NULL ? rl_tls_write(conn->ssl, buf, len)
                                  : send(conn->fd, buf, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (conn->ssl == NULL) conn->out += (unsigned long long)n;
    buf += n;
    len -= (size_t)n;
  }
  conn->whole = 1;
  return 0;
}

/*
 * Runs a set-up command (AUTH, SELECT) on a fresh connection. On failure writes
 * err and closes. Returns 0 or -1.
 */
static int setup_command(rl_conn *conn, const char *what, int argc, const char **argv,
                         const size_t *len, char err[RL_ERRLEN]) {
  char where[128];
  redisReply *r = NULL;
  int rc = rl_conn_send(conn, argc, argv, len, err);
  if (rc == 0) rc = rl_conn_read_reply(conn, conn->o.timeout_ms, -1, &r, err);
  if (rc == RL_READ_TIMEOUT) {
    errno = EAGAIN;
    rl_conn_io_error(conn, 0, 1, conn->o.timeout_ms, err);
  }
  if (r == NULL) return -1;
  if (r->type == REDIS_REPLY_ERROR) {
    rl_conn_describe(conn, where, sizeof where);
    snprintf(err, RL_ERRLEN, "redis: %s refused by %s: %.*s", what, where, (int)r->len, r->str);
    freeReplyObject(r);
    rl_conn_close(conn);
    return -1;
  }
  freeReplyObject(r);
  return 0;
}

/* Connects (TLS when asked), then authenticates and selects the db. */
int rl_conn_open(rl_conn *conn, char err[RL_ERRLEN]) {
  char where[128], db[24];
  const char *argv[3];
  size_t len[3];
  long long deadline = rl_now_ms() + conn->o.connect_timeout_ms;
  rl_conn_describe(conn, where, sizeof where);
  if (open_socket(conn, where, deadline, err) != 0) return -1;
  conn->gen = rl_fork_gen();
  if (conn->o.tls != NULL) {
    conn->ssl = rl_tls_handshake(conn->o.tls, conn->fd, conn->o.host, where, deadline, err, RL_ERRLEN);
    if (conn->ssl == NULL) {
      rl_conn_close(conn);
      return -1;
    }
  }
  conn->reader = redisReaderCreate();
  if (conn->reader == NULL || set_blocking(conn->fd) != 0) {
    snprintf(err, RL_ERRLEN, "connection: cannot connect to %s (%s)", where,
             conn->reader == NULL ? "out of memory" : strerror(errno));
    rl_conn_close(conn);
    return -1;
  }
  if (conn->o.password != NULL) {
    int n = 0;
    argv[n++] = "AUTH";
    if (conn->o.username != NULL) argv[n++] = conn->o.username;
    argv[n++] = conn->o.password;
    for (int i = 0; i < n; i++) len[i] = strlen(argv[i]);
    if (setup_command(conn, "AUTH", n, argv, len, err) != 0) return -1;
  }
  if (conn->o.db != 0) {
    argv[0] = "SELECT";
    argv[1] = db;
    len[0] = 6;
    len[1] = (size_t)snprintf(db, sizeof db, "%lld", conn->o.db);
    if (setup_command(conn, "SELECT", 2, argv, len, err) != 0) return -1;
  }
  return 0;
}

redisReply *rl_conn_command(rl_conn *conn, int argc, const char **argv,
                            const size_t *len, int resend, char err[RL_ERRLEN]) {
  char stack[1024], *buf;
  long long n = rl_format(stack, sizeof stack, &buf, argc, argv, len);
  rl_call call;
  redisReply *r;
  if (n < 0) {
    format_failed(err);
    return NULL;
  }
  rl_call_init_command(&call, buf, (size_t)n, resend);
  if (rl_conn_call(conn, &call) != 0) memcpy(err, call.err, RL_ERRLEN);
  r = call.reply;
  call.reply = NULL;
  rl_call_free(&call);
  if (buf != stack) free(buf);
  return r;
}

redisReply *rl_conn_args(rl_conn *conn, rl_args_cmd *a, char err[RL_ERRLEN]) {
  rl_call call;
  redisReply *r;
  rl_call_init_args(&call, a);
  if (rl_conn_call(conn, &call) != 0) memcpy(err, call.err, RL_ERRLEN);
  r = call.reply;
  call.reply = NULL;
  rl_call_free(&call);
  return r;
}

int rl_conn_retarget(rl_conn *conn, const char *host, int port) {
  char *h = strdup(host);
  if (h == NULL) return -1;
  rl_conn_close(conn);
  free(conn->o.host);
  conn->o.host = h;
  conn->o.port = port;
  rl_conn_describe(conn, conn->where, sizeof conn->where);
  return 0;
}

int rl_conn_usable(rl_conn *conn) {
  if (conn->fd < 0) return 0;
  if (conn->gen != rl_fork_gen() || went_away(conn)) {
    rl_conn_close(conn);
    return 0;
  }
  return 1;
}

int rl_conn_begin(rl_conn *conn, char err[RL_ERRLEN]) {
  conn->sends = conn->redialed = 0;
  if (rl_conn_usable(conn)) return 1;
  return rl_conn_open(conn, err) == 0 ? 0 : -1;
}

int rl_conn_send(rl_conn *conn, int argc, const char **argv, const size_t *len, char err[RL_ERRLEN]) {
  char stack[1024], *buf;
  long long n;
  int rc;
  if (conn->fd >= 0 && conn->gen != rl_fork_gen()) rl_conn_close(conn);
  if (conn->fd < 0 && rl_conn_open(conn, err) != 0) return -1;
  n = rl_format(stack, sizeof stack, &buf, argc, argv, len);
  if (n < 0) return format_failed(err);
  rc = rl_conn_io_timeout(conn, conn->o.timeout_ms) == 0 ? rl_conn_write(conn, buf, (size_t)n) : -1;
  if (buf != stack) free(buf);
  if (rc != 0) {
    int timeout = errno == EAGAIN || errno == EWOULDBLOCK;
    rl_conn_io_error(conn, 0, timeout, conn->o.timeout_ms, err);
    return -1;
  }
  return 0;
}

int rl_conn_read_reply(rl_conn *conn, long long timeout_ms, int wake_fd, redisReply **reply,
                       char err[RL_ERRLEN]) {
  long long deadline = rl_now_ms() + timeout_ms;
  char in[4096];
  *reply = NULL;
  if (conn->fd < 0) {
    snprintf(err, RL_ERRLEN, "connection: not connected");
    return RL_READ_FAILED;
  }
  for (;;) {
    void *r = NULL;
    ssize_t n;
    if (redisReaderGetReply(conn->reader, &r) != REDIS_OK) {
      char where[128];
      rl_conn_describe(conn, where, sizeof where);
      rl_read_error(conn->reader->err, conn->reader->errstr, where, err, RL_ERRLEN);
      rl_conn_close(conn);
      return RL_READ_FAILED;
    }
    if (r != NULL) {
      *reply = (redisReply *)r;
      return RL_READ_REPLY;
    }
    if (wake_fd < 0) {
      /* Nothing else to wait for: the read blocks, bounded by the socket's timeout. */
      long long left = deadline - rl_now_ms();
      if (left <= 0) return RL_READ_TIMEOUT;
      if (rl_conn_io_timeout(conn, left) != 0) {
        rl_conn_io_error(conn, 0, 0, timeout_ms, err);
        return RL_READ_FAILED;
      }
    } else if (conn->ssl == NULL || rl_tls_pending(conn->ssl) == 0) {
      struct pollfd p[2];
      long long left = deadline - rl_now_ms();
      int ready;
      if (left <= 0) return RL_READ_TIMEOUT;
      p[0].fd = conn->fd, p[0].events = POLLIN, p[0].revents = 0;
      p[1].fd = wake_fd, p[1].events = POLLIN, p[1].revents = 0;
      ready = poll(p, 2, (int)(left > 60000 ? 60000 : left));
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) {
        rl_conn_io_error(conn, 0, 0, timeout_ms, err);
        return RL_READ_FAILED;
      }
      if (p[1].revents != 0) return RL_READ_WOKEN;
      if (ready == 0) continue; /* the deadline is checked above */
    }
    n = conn->ssl != NULL ? rl_tls_read(conn->ssl, in, sizeof in) : recv(conn->fd, in, sizeof in, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && wake_fd < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue; /* the deadline, above */
    if (n <= 0) {
      rl_conn_io_error(conn, n == 0, 0, timeout_ms, err);
      return RL_READ_FAILED;
    }
    conn->answered = 1;
    if (redisReaderFeed(conn->reader, in, (size_t)n) != REDIS_OK) {
      snprintf(err, RL_ERRLEN, "connection: out of memory");
      rl_conn_close(conn);
      return RL_READ_FAILED;
    }
  }
}

void rl_conn_set_timeout(rl_conn *conn, long long ms) {
  conn->o.timeout_ms = ms; /* the socket's own follows at the next command */
}

rl_step rl_conn_lost(rl_conn *conn, rl_call *call, int eof, int timeout, long long timeout_ms) {
  /* Bytes the server never read on a connection it had answered on: it
     closed the connection while idle, and nothing ran. */
  int e = errno, idle_close = !timeout && conn->answered && !conn->redialed && untaken(conn);
  int first = conn->sends == 1;
  errno = e; /* for the message */
  rl_conn_io_error(conn, eof, timeout, timeout_ms, call->err);
  if (!idle_close) return rl_call_lost(call, timeout, call->err);
  conn->redialed = 1;
  if (conn->ask_first) {
    /* Behind Sentinel no new connection within a call: the node may have
       been demoted, and the sentinels are asked first. Nothing of the call
       ran when those bytes were its first. */
    size_t used = strlen(call->err);
    rl_step step;
    if (first) {
      snprintf(call->err + used, sizeof call->err - used, " (nothing was sent)");
      return RL_STEP_FAILED;
    }
    /* Later bytes of the call: the loss as each phase takes it (a take's
       WAIT is done, with its error), but never on a new connection. */
    step = rl_call_lost(call, timeout, call->err);
    return step == RL_STEP_RECONNECT ? RL_STEP_FAILED : step;
  }
  /* As if it had been found closed before sending: a fresh one, the same bytes. */
  if (rl_conn_open(conn, call->err) != 0) return RL_STEP_FAILED;
  return rl_call_start(call, 0, conn->reader);
}

/*
 * Drives call (rl_call.h) over the connection: its bytes are written at
 * once, and each read is fed to it, all within its read time; another
 * connection, when it asks, is a fresh one. Returns 0 (RL_STEP_DONE) or -1
 * (RL_STEP_FAILED, call->err).
 */
int rl_conn_call(rl_conn *conn, rl_call *call) {
  char in[16384];
  long long deadline = 0, read_ms = conn->o.timeout_ms;
  int reused, sent = 0;
  rl_step step;
  call->where = conn->where;
  call->timeout_ms = conn->o.timeout_ms;
  if (conn->asking) call->asking = 1;
  reused = rl_conn_begin(conn, call->err);
  if (reused < 0) return -1;
  step = rl_call_start(call, reused, conn->reader);
  for (;;) {
    size_t len;
    const char *bytes;
    ssize_t n;
    switch (step) {
    case RL_STEP_SEND:
      bytes = rl_call_bytes(call, &len);
      read_ms = rl_call_read_ms(call);
      deadline = rl_now_ms() + read_ms;
      if (rl_conn_io_timeout(conn, read_ms) != 0 || rl_conn_write(conn, bytes, len) != 0) {
        int timeout = errno == EAGAIN || errno == EWOULDBLOCK;
        step = rl_conn_lost(conn, call, 0, timeout, read_ms);
        break;
      }
      sent = 1; /* the socket's timeout is the read time already */
      step = RL_STEP_READ;
      break;
    case RL_STEP_READ:
      if (!sent && (rl_now_ms() >= deadline || rl_conn_io_timeout(conn, deadline - rl_now_ms()) != 0)) {
        /* A reply in pieces: the read time covers all of them. */
        errno = EAGAIN;
        step = rl_conn_lost(conn, call, 0, 1, read_ms);
        break;
      }
      do n = conn->ssl != NULL ? rl_tls_read(conn->ssl, in, sizeof in) : recv(conn->fd, in, sizeof in, 0);
      while (n < 0 && errno == EINTR);
      if (n <= 0) {
        int timeout = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
        step = rl_conn_lost(conn, call, n == 0, timeout, read_ms);
        break;
      }
      conn->answered = 1;
      sent = 0;
      step = rl_call_feed(call, in, (size_t)n);
      break;
    case RL_STEP_RECONNECT:
      rl_conn_close(conn);
      if (rl_conn_open(conn, call->err) != 0) return -1;
      step = rl_call_start(call, 0, conn->reader);
      break;
    case RL_STEP_DONE:
    case RL_STEP_FAILED:
      if (!rl_call_keep(call)) rl_conn_close(conn);
      return step == RL_STEP_DONE ? 0 : -1;
    }
  }
}

int rl_conn_eval(rl_conn *conn, rl_cmd *cmd, rl_result *out, char err[RL_ERRLEN], rl_redirect_to *to) {
  rl_call call;
  int rc;
  rl_call_init(&call, cmd);
  rc = rl_conn_call(conn, &call);
  *out = call.out;
  *to = call.redirect;
  if (rc != 0) memcpy(err, call.err, RL_ERRLEN);
  rl_call_free(&call);
  return rc;
}
