/* SPDX-License-Identifier: MIT */
/*
 * One lock script call (or one plain command) as a state machine with no I/O, driven by both
 * transports (as hiredis' reader is by its sync and async contexts): the C
 * transport (rl_conn.c) with its sockets, Redlock's calls to several
 * servers (rl_many.c), the OpenResty transport (lua/redislock/ngx.lua)
 * through core.script_call and core.command_call (rl_lua_call.c). The machine
 * says which bytes to send and on which connection; the transport sends
 * them, feeds back what it reads, or says the connection failed. The steps
 * around the script live here only:
 *
 * - a take (MULTI, SET NX PX, XADD to the slot's fence record, EXEC: the
 *   fence is the record's new ID) falls back on the acquire script when
 *   the lock is held or the ID tells no fence (csrc/scripts/README.md,
 *   "Fences"); a script that then fails gives the take's lock back (plain
 *   commands: WATCH, GET, MULTI, DEL, EXEC);
 * - EVALSHA, then EVAL after NOSCRIPT (which caches the script), for the
 *   lock scripts and for those sent with their callers' arguments (the
 *   multi-key acquire, the admin's, guarded writes, elections);
 * - a script sent with its first keys only (the release) that answers
 *   RL_ALL_KEYS is sent again with all of them (its wake-up's names);
 * - the one resend per call: bytes lost on a connection that had answered
 *   before (idle in a pool, or the server closed it meanwhile), not timed
 *   out, go once more on another, except a release's (a second would find
 *   the hold gone) and a take's (it may have landed: the acquire script
 *   follows instead, and finds its own token);
 * - ASKING before the command in the same write (a cluster's ASK redirect;
 *   a take becomes the acquire script then);
 * - WAIT for replicas on the connection that wrote, after a script that
 *   answered RL_HELD.
 */
#ifndef REDISLOCK_RL_CALL_H
#define REDISLOCK_RL_CALL_H

#include <stddef.h>

#include <hiredis/hiredis.h>

#include "rl_proto.h"

#pragma GCC visibility push(hidden)

/* Where a cluster redirected a call (a MOVED or ASK reply to its script). */
typedef struct {
  rl_redirect_kind kind; /* RL_NO_REDIRECT: none */
  int slot, port;
  char host[256];        /* "": the node just asked */
} rl_redirect_to;

/* What a failed call left of the lock its take took (rl_call's left),
   said beside its message (whose end says RL_LEFT_NOTHING in words; what
   RL_LEFT_STAYING leaves, the caller's release decides and says). */
typedef enum {
  RL_LEFT_UNSAID,  /* its take took none, or the call cannot tell */
  RL_LEFT_NOTHING, /* the call gave it back: nothing to release */
  RL_LEFT_STAYING  /* the call could not give it back: it stays until its TTL ends */
} rl_left;

/* What the transport does next. */
typedef enum {
  RL_STEP_SEND,      /* write rl_call_bytes() on the connection, then read: feed
                        what comes (rl_call_feed) within rl_call_read_ms() */
  RL_STEP_READ,      /* read more and feed it: the replies are not all in */
  RL_STEP_RECONNECT, /* close the connection, take another (the C transport a
                        fresh one, the cosockets one from the pool) and call
                        rl_call_start again */
  RL_STEP_DONE,      /* out (and acked or wait_err) hold the result */
  RL_STEP_FAILED     /* err says why */
} rl_step;

typedef struct {
  /* Set by the transport before the first rl_call_start (rl_call_init
     sets none, no WAIT, a 1 s timeout and "?"). */
  int asking;              /* ASKING before the command */
  long long replicas;      /* WAIT for this many replicas after RL_HELD (0: none) */
  long long replica_ms;    /* ... for at most this long */
  long long timeout_ms;    /* a reply's time bound (WAIT's is this plus replica_ms) */
  const char *where;       /* the server, for messages ("host:port") */

  /* The result. */
  rl_result out;
  long long acked;             /* WAIT's count, when asked and wait_err is "" */
  char wait_err[RL_ERRLEN]; /* why WAIT failed, the lock being ours all the same */
  char err[RL_ERRLEN];      /* RL_STEP_FAILED's message: "connection: ..." or "redis: ..." */
  rl_left left;             /* RL_STEP_FAILED: what is left of the lock its take took */
  rl_redirect_to redirect;  /* RL_STEP_FAILED on a redirect: where to send the call again */
  redisReply *reply;            /* a plain command's (error replies too): the caller's to free */

  /* The machine's own. */
  rl_cmd *cmd;                  /* NULL for a plain command, or: */
  rl_args_cmd *args;            /* a script with its caller's arguments; or: */
  const char *command;          /* its bytes */
  size_t command_len;
  int resend;                   /* a plain command safe to send twice */
  redisReader *reader;
  int phase;          /* what the bytes being sent are (rl_call.c's PH_*) */
  int reused;         /* the connection answered before these bytes were sent */
  int fresh;          /* nothing was read since the bytes were made */
  int resent;         /* the one resend is spent */
  int evaled;         /* EVAL was sent after a NOSCRIPT */
  int taken;          /* the take's SET took the lock: a script that fails after it gives it back */
  int keep;           /* the connection is in step and may serve the next call */
  int prefixed;       /* the bytes begin with ASKING */
  int want, got;      /* replies the bytes are answered with, and read so far */
  redisReply *r[RL_TAKE_REPLIES];
  long long len;      /* of the bytes */
  char *bytes;        /* stack, or an allocation */
  char stack[1024];
} rl_call;

/*
 * Prepares a call of cmd (rl_cmd_init'd; the call points at it, and may
 * change it: a take into the acquire, EVALSHA into EVAL).
 * No I/O. Set the fields above it, then rl_call_start.
 */
void rl_call_init(rl_call *call, rl_cmd *cmd);

/*
 * Prepares a call of one plain command (its len bytes, kept by the caller
 * until the call ends), answered by one reply
 * (call->reply, which the caller takes: set it to NULL before
 * rl_call_free). It goes after ASKING when asked, and is resent like a
 * script when resend says it is safe to run twice. No I/O.
 */
void rl_call_init_command(rl_call *call, const char *bytes, size_t len, int resend);

/*
 * Prepares a call of a script with its caller's arguments (rl_args_init'd;
 * the call points at it, and turns it into EVAL after a NOSCRIPT), answered
 * by one reply (call->reply, as a plain command's), resent as a lock
 * script when its op may run twice. No I/O.
 */
void rl_call_init_args(rl_call *call, rl_args_cmd *args);

/*
 * A connection is ready (reused: it served an earlier call), with its reader
 * (empty): makes the bytes of the current step. RL_STEP_SEND, or
 * RL_STEP_FAILED when out of memory.
 */
rl_step rl_call_start(rl_call *call, int reused, redisReader *reader);

/* The bytes to send now, and their length. */
const char *rl_call_bytes(const rl_call *call, size_t *len);

/* How long the replies to those bytes may take (ms). */
long long rl_call_read_ms(const rl_call *call);

/*
 * n bytes read from the connection: RL_STEP_READ (more), RL_STEP_SEND (the
 * next bytes, on this connection), RL_STEP_RECONNECT, RL_STEP_DONE or
 * RL_STEP_FAILED. Bytes that cannot be read fail the call (the connection
 * must be closed).
 */
rl_step rl_call_feed(rl_call *call, const char *in, size_t n);

/*
 * The write or a read failed (timeout: it timed out), described by msg (a
 * "connection: ..." message; it may be call->err itself); the transport
 * closes the connection.
 * RL_STEP_RECONNECT (the one resend), RL_STEP_DONE (the lock was ours
 * already: the failure is wait_err's) or RL_STEP_FAILED.
 */
rl_step rl_call_lost(rl_call *call, int timeout, const char *msg);

/* After RL_STEP_DONE or RL_STEP_FAILED: whether the connection may serve
   another call (in step, and its name, if any, right); else close it. */
int rl_call_keep(const rl_call *call);

/* The name of left for Lua ("nothing", "staying"), NULL for RL_LEFT_UNSAID. */
const char *rl_left_name(rl_left left);

/* Frees what the call holds (replies read, its bytes). Idempotent. */
void rl_call_free(rl_call *call);

#pragma GCC visibility pop

#endif
