/* SPDX-License-Identifier: MIT */
/* The blocking transport over a hiredis context. */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* strdup under -std=c99 */
#endif
#include "rl_conn.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
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
  conn->o = *opts;
  conn->o.host = dup_or_null(opts->host, &failed);
  conn->o.path = dup_or_null(opts->path, &failed);
  conn->o.username = dup_or_null(opts->username, &failed);
  conn->o.password = dup_or_null(opts->password, &failed);
  return failed ? -1 : 0;
}

void rl_conn_close(rl_conn *conn) {
  if (conn->ctx != NULL) {
    redisFree(conn->ctx); /* only close(2): nothing is sent */
    conn->ctx = NULL;
  }
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

/* Milliseconds as the struct timeval hiredis wants. */
static struct timeval ms_to_tv(long long ms) {
  struct timeval tv;
  tv.tv_sec = (time_t)(ms / 1000);
  tv.tv_usec = (suseconds_t)((ms % 1000) * 1000);
  return tv;
}

/* True when the context's error is a read or write timeout (hiredis 0.14 reports
   SO_RCVTIMEO expiring as an I/O error with EAGAIN's text). */
static int timed_out(const redisContext *ctx) {
#ifdef REDIS_ERR_TIMEOUT /* hiredis >= 1.0 names it */
  if (ctx->err == REDIS_ERR_TIMEOUT) return 1;
#endif
  return ctx->err == REDIS_ERR_IO && strcmp(ctx->errstr, "Resource temporarily unavailable") == 0;
}

/*
 * True when an idle connection can no longer be used: between commands the
 * server sends nothing, so a readable socket means it closed the connection
 * (its timeout, CLIENT KILL, a restart) or sent bytes no command asked for.
 * Checked before sending, so no command is sent twice on its account.
 */
static int went_away(const redisContext *ctx) {
  struct pollfd p;
  p.fd = ctx->fd;
  p.events = POLLIN;
  p.revents = 0;
  return poll(&p, 1, 0) > 0;
}

/* Describes the error the context reported into err, then drops the context. */
static void io_error(rl_conn *conn, char err[RL_ERRLEN]) {
  char where[128];
  const redisContext *ctx = conn->ctx;
  rl_conn_describe(conn, where, sizeof where);
  if (timed_out(ctx))
    snprintf(err, RL_ERRLEN, "connection: %s did not answer within %g s (timeout)",
             where, (double)conn->o.timeout_ms / 1000.0);
  else if (ctx->err == REDIS_ERR_EOF)
    snprintf(err, RL_ERRLEN, "connection: %s closed the connection", where);
  else
    rl_read_error(ctx->err, ctx->errstr, where, err, RL_ERRLEN);
  rl_conn_close(conn);
}

/*
 * Runs a set-up command (AUTH, SELECT) on a fresh context. On failure writes
 * err and drops the context. Returns 0 or -1.
 */
static int setup_command(rl_conn *conn, const char *what, int argc, const char **argv,
                         const size_t *len, char err[RL_ERRLEN]) {
  char where[128];
  redisReply *r = redisCommandArgv(conn->ctx, argc, argv, len);
  if (r == NULL) {
    io_error(conn, err);
    return -1;
  }
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

/* Connects, sets the command timeout, authenticates and selects the db. */
static int conn_open(rl_conn *conn, char err[RL_ERRLEN]) {
  char where[128], db[24];
  const char *argv[3];
  size_t len[3];
  struct timeval ctv = ms_to_tv(conn->o.connect_timeout_ms);
  redisContext *ctx = conn->o.path != NULL
                          ? redisConnectUnixWithTimeout(conn->o.path, ctv)
                          : redisConnectWithTimeout(conn->o.host, conn->o.port, ctv);
  rl_conn_describe(conn, where, sizeof where);
  if (ctx == NULL) {
    snprintf(err, RL_ERRLEN, "connection: cannot connect to %s (out of memory)", where);
    return -1;
  }
  if (ctx->err) {
    snprintf(err, RL_ERRLEN, "connection: cannot connect to %s (%s)", where, ctx->errstr);
    redisFree(ctx);
    return -1;
  }
  conn->ctx = ctx;
  conn->gen = rl_fork_gen();
  if (redisSetTimeout(ctx, ms_to_tv(conn->o.timeout_ms)) != REDIS_OK) {
    io_error(conn, err);
    return -1;
  }
  if (conn->o.path == NULL) redisEnableKeepAlive(ctx);
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
  redisReply *r;
  int reused;
  /* After fork() the socket is shared with the parent: replies would mix. */
  if (conn->ctx != NULL && (conn->gen != rl_fork_gen() || went_away(conn->ctx))) rl_conn_close(conn);
  reused = conn->ctx != NULL;
  if (!reused && conn_open(conn, err) != 0) return NULL;
  r = redisCommandArgv(conn->ctx, argc, argv, len);
  if (r == NULL && reused && resend && !timed_out(conn->ctx)) {
    /* The connection died between went_away() and the send, or the server
       closed it while running the command. The caller said the command is
       safe to send twice, so try once more on a fresh connection. Not after
       a timeout: the server is slow, and the caller's time bound must hold. */
    rl_conn_close(conn);
    if (conn_open(conn, err) != 0) return NULL;
    r = redisCommandArgv(conn->ctx, argc, argv, len);
  }
  if (r == NULL) io_error(conn, err);
  return r;
}

int rl_conn_wait_replicas(rl_conn *conn, long long replicas, long long ms, long long *acked,
                          char err[RL_ERRLEN]) {
  char n[24], t[24];
  const char *argv[3] = { "WAIT", n, t };
  size_t len[3];
  redisReply *r;
  len[0] = 4;
  len[1] = (size_t)snprintf(n, sizeof n, "%lld", replicas);
  len[2] = (size_t)snprintf(t, sizeof t, "%lld", ms);
  /* Only on the connection that wrote: WAIT counts that connection's writes. */
  if (conn->ctx == NULL || conn->gen != rl_fork_gen() ||
      redisSetTimeout(conn->ctx, ms_to_tv(ms + conn->o.timeout_ms)) != REDIS_OK) {
    snprintf(err, RL_ERRLEN, "connection: lost the connection before WAIT");
    rl_conn_close(conn);
    return -1;
  }
  r = redisCommandArgv(conn->ctx, 3, argv, len);
  if (r == NULL) {
    io_error(conn, err);
    return -1;
  }
  redisSetTimeout(conn->ctx, ms_to_tv(conn->o.timeout_ms));
  if (r->type != REDIS_REPLY_INTEGER) {
    snprintf(err, RL_ERRLEN, "redis: WAIT: %.*s", r->type == REDIS_REPLY_ERROR ? (int)r->len : 0,
             r->type == REDIS_REPLY_ERROR ? r->str : "");
    freeReplyObject(r);
    return -1;
  }
  *acked = r->integer;
  freeReplyObject(r);
  return 0;
}

void rl_conn_set_timeout(rl_conn *conn, long long ms) {
  conn->o.timeout_ms = ms;
  if (conn->ctx != NULL && redisSetTimeout(conn->ctx, ms_to_tv(ms)) != REDIS_OK)
    rl_conn_close(conn); /* the next command reconnects, with the new timeout */
}

int rl_conn_eval(rl_conn *conn, rl_cmd *cmd, rl_result *out, char err[RL_ERRLEN]) {
  char msg[RL_ERRLEN - 8];
  int attempt;
  for (attempt = 0; attempt < 2; attempt++) {
    rl_decoded d;
    /* Every script but release may be sent twice: acquire and acquire_fair
       treat their own token as success, extend, pttl and leave repeat
       harmlessly. A repeated release would find the key gone and report the
       lock lost. */
    redisReply *r = rl_conn_command(conn, cmd->argc, cmd->argv, cmd->len,
                                    cmd->op != RL_OP_RELEASE, err);
    if (r == NULL) return -1;
    d = rl_decode(r, out, msg, sizeof msg);
    freeReplyObject(r);
    if (d == RL_DECODED) return 0;
    if (d == RL_NOSCRIPT && attempt == 0) {
      rl_cmd_use_eval(cmd); /* EVAL also caches the script for the next EVALSHA */
      continue;
    }
    if (d == RL_NOSCRIPT) snprintf(msg, sizeof msg, "NOSCRIPT after EVAL");
    break;
  }
  snprintf(err, RL_ERRLEN, "redis: %s", msg);
  return -1;
}
