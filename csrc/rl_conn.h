/* SPDX-License-Identifier: MIT */
/*
 * The blocking transport: a socket of its own per connection (TCP or unix),
 * connected on first use with a deadline, optionally TLS (rl_tls), commands
 * built by hiredis' formatter and written at once, replies read into hiredis'
 * reader. Connect and command timeouts, AUTH and SELECT. Once a connection
 * reports an error it is closed and the next call connects afresh; a forked
 * child never reuses its parent's socket.
 */
#ifndef REDISLOCK_RL_CONN_H
#define REDISLOCK_RL_CONN_H

#include <stddef.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

#include "rl_call.h"
#include "rl_proto.h"
#include "rl_tls.h"

#pragma GCC visibility push(hidden)

/* Where and how to connect. Strings are owned by the rl_conn (see rl_conn_init). */
typedef struct {
  char *host;       /* TCP host, when path is NULL */
  int port;
  char *path;       /* unix socket path, or NULL */
  char *username;   /* ACL user, or NULL */
  char *password;   /* or NULL */
  long long db;
  long long connect_timeout_ms;
  long long timeout_ms;
  rl_tls *tls;      /* TLS settings, or NULL for plaintext (TCP only) */
} rl_conn_opts;

typedef struct {
  rl_conn_opts o;
  int fd;                 /* -1 until connected, and after an error */
  struct ssl_st *ssl;     /* the TLS session on fd, when o.tls */
  redisReader *reader;    /* replies read so far; made with the connection */
  unsigned gen;           /* rl_fork_gen() when fd was opened: a forked child's differs */
  long long rcv_ms;       /* the socket's read and write timeout now (0: not set) */
  unsigned long long out; /* bytes the socket took (plaintext; TLS counts its own) */
  int whole;              /* the last bytes written went out whole */
  int answered;           /* a reply came on this connection */
  int sends;              /* bytes written for the call now made */
  int redialed;           /* that call started over once on a fresh connection */
  int ask_first;          /* behind Sentinel: a connection the server closed is not
                             replaced within a call, whose error then ends with
                             "(nothing was sent)" (redislock/sentinel.lua asks
                             the sentinels first); set by the owner after init */
  int asking;             /* while set, each command goes after an ASKING (a
                             cluster's ASK redirect), in the same write */
  char where[128];        /* "host:port" or the socket path, for messages */
} rl_conn;

/*
 * Copies opts (and its strings) into conn, taking a reference to opts->tls;
 * no I/O. Returns 0, or -1 when out of memory, leaving conn safe to pass to
 * rl_conn_free.
 */
int rl_conn_init(rl_conn *conn, const rl_conn_opts *opts);
/* Closes the connection, if any; conn stays usable (the next call reconnects). */
void rl_conn_close(rl_conn *conn);
/* Closes and frees what rl_conn_init copied. Idempotent. */
void rl_conn_free(rl_conn *conn);

/*
 * Sends one command and returns its reply (free it with freeReplyObject), which
 * may be an error reply. Returns NULL with a message in err, beginning with
 * "connection:" (refused, timed out, closed) or "redis:" (AUTH or SELECT
 * refused), when no reply could be had. It is an rl_call (rl_conn_call):
 * with resend set, a command lost on a connection that had answered
 * before, not timed out, is sent once more on a fresh one; pass it only for
 * commands that are safe to run twice.
 */
redisReply *rl_conn_command(rl_conn *conn, int argc, const char **argv,
                            const size_t *len, int resend, char err[RL_ERRLEN]);

/*
 * Runs a (rl_args_init'd: a script with its caller's arguments) on the
 * connection, EVAL after NOSCRIPT, as rl_conn_command runs a command: its
 * reply (the caller's to free), or NULL with err.
 */
redisReply *rl_conn_args(rl_conn *conn, rl_args_cmd *a, char err[RL_ERRLEN]);

/*
 * Drives call (rl_call.h: a lock script with its NOSCRIPT, resend,
 * ASKING and WAIT steps) over the connection, connecting first when needed;
 * another connection, when the call asks, is a fresh one. Returns 0 with
 * the result in call, or -1 with call->err.
 */
int rl_conn_call(rl_conn *conn, rl_call *call);

/* rl_conn_call of cmd with no WAIT: 0 with out, or -1 with err (and, when
   a cluster redirected it, where to in to). */
int rl_conn_eval(rl_conn *conn, rl_cmd *cmd, rl_result *out, char err[RL_ERRLEN], rl_redirect_to *to);

/* The most connections rl_conn_eval_many takes at once. */
#define RL_MANY_MAX 64

/*
 * Runs cmds[i] (scripts, not takes) on conns[i] for each i < n (at most
 * RL_MANY_MAX) at once: each is sent (connecting first when needed), then
 * the replies are read as they come, polling all the sockets together,
 * until all answered or timeout_ms passed since the start (connecting to
 * each is bounded by its own connect timeout). A NOSCRIPT is followed by
 * the EVAL on that connection alone. rc[i] is 0 with out[i], or -1 with a
 * "connection:" or "redis:" message in err[i] (a connection that failed or
 * timed out is closed).
 */
void rl_conn_eval_many(rl_conn *const *conns, rl_cmd *const *cmds, int n, long long timeout_ms,
                       rl_result *out, int *rc, char (*err)[RL_ERRLEN]);

/* For rl_many.c, which drives several connections itself (rl_conn.c):
   connects (TLS, AUTH, SELECT; 0, or -1 with err); writes all of buf (0,
   or -1 with errno); sets how long a read or write on the open socket may
   block (0, or -1); and describes why a read or write failed (errno,
   eof, or a timeout of timeout_ms) into err, closing the connection. */
int rl_conn_open(rl_conn *conn, char err[RL_ERRLEN]);
/* Before a call on conn (rl_conn_usable, then rl_conn_open when it is not):
   1 when it was open already (reused), 0 when opened now, -1 with err. */
int rl_conn_begin(rl_conn *conn, char err[RL_ERRLEN]);
/* A call's write or read on conn failed (eof; timeout: after timeout_ms):
   why, into call->err (the connection closed), then what the call does.
   When the server had closed the connection while idle, so that it never
   read the bytes (told from the socket, rl_conn.c's untaken), the call
   starts over on a fresh connection, once per call (RL_STEP_SEND), or, on
   an ask_first connection, fails (with "(nothing was sent)" if those bytes
   were its first). */
rl_step rl_conn_lost(rl_conn *conn, rl_call *call, int eof, int timeout, long long timeout_ms);
int rl_conn_write(rl_conn *conn, const char *buf, size_t len);
int rl_conn_io_timeout(rl_conn *conn, long long ms);
void rl_conn_io_error(rl_conn *conn, int eof, int timeout, long long timeout_ms, char err[RL_ERRLEN]);

/*
 * Points conn at another TCP host and port (a master named by Sentinel): the
 * connection is closed, and the next call connects there. 0, or -1 when out
 * of memory (conn unchanged).
 */
int rl_conn_retarget(rl_conn *conn, const char *host, int port);

/*
 * Whether the connection is open and fit for the next command: 0 when it was
 * never opened, failed, or belongs to a parent process (then it is closed
 * here): the next call reconnects. No system call on Linux: a connection
 * the server closed meanwhile is found by the next call (rl_conn_lost);
 * elsewhere a TCP one is found here, by poll(2).
 */
int rl_conn_usable(rl_conn *conn);

/*
 * For a subscription: sends one command (connecting first when needed) and
 * reads nothing. 0, or -1 with err and the connection closed.
 */
int rl_conn_send(rl_conn *conn, int argc, const char **argv, const size_t *len, char err[RL_ERRLEN]);

/* What rl_conn_read_reply found. */
enum { RL_READ_REPLY, RL_READ_TIMEOUT, RL_READ_WOKEN, RL_READ_FAILED };

/*
 * For a subscription: waits at most timeout_ms for the next reply on the open
 * connection (one already read stays first), or for wake_fd (-1: none) to be
 * readable. RL_READ_REPLY with *reply (free it), RL_READ_TIMEOUT,
 * RL_READ_WOKEN, or RL_READ_FAILED with err and the connection closed.
 */
int rl_conn_read_reply(rl_conn *conn, long long timeout_ms, int wake_fd, redisReply **reply,
                       char err[RL_ERRLEN]);

/* Sets the reply timeout (ms) of the open connection and of later ones. */
void rl_conn_set_timeout(rl_conn *conn, long long ms);

/* "host:port" or the socket path, for messages. */
void rl_conn_describe(const rl_conn *conn, char *buf, size_t len);

#pragma GCC visibility pop

#endif
