/* SPDX-License-Identifier: MIT */
/* One lock script call as a state machine with no I/O (see rl_call.h). */
#include "rl_call.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where the call stands: what the bytes being sent are. */
enum {
  PH_TAKE,   /* the take's transaction */
  PH_SCRIPT, /* the script (after ASKING when asked) */
  PH_WAIT,   /* WAIT replicas ms */
  PH_COMMAND, /* a plain command (rl_call_init_command) */
  PH_ARGS,    /* a script with its caller's arguments (rl_call_init_args) */
  PH_UNDO,    /* WATCH lock, GET lock: the script after a take failed, the take's lock goes */
  PH_UNDO_DEL /* MULTI, DEL lock, EXEC: the lock held the take's token */
};

static const char ASKING[] = "*1\r\n$6\r\nASKING\r\n";

/* Frees the replies read so far. */
static void drop_replies(rl_call *call) {
  for (int i = 0; i < call->got; i++) freeReplyObject(call->r[i]);
  call->got = 0;
}

static void drop_bytes(rl_call *call) {
  if (call->bytes != NULL && call->bytes != call->stack) free(call->bytes);
  call->bytes = NULL;
  call->len = 0;
}

/* What both kinds of call start with. */
static void init(rl_call *call, rl_cmd *cmd, int phase) {
  call->asking = 0;
  call->replicas = 0;
  call->replica_ms = 0;
  call->timeout_ms = 1000;
  call->where = "?";
  call->out.status = RL_FREE;
  call->out.value = 0;
  call->acked = 0;
  call->wait_err[0] = '\0';
  call->err[0] = '\0';
  call->left = RL_LEFT_UNSAID;
  call->redirect.kind = RL_NO_REDIRECT;
  call->cmd = cmd;
  call->args = NULL;
  call->command = NULL;
  call->command_len = 0;
  call->resend = 0;
  call->reader = NULL;
  call->phase = phase;
  call->reply = NULL;
  call->reused = call->resent = call->evaled = call->prefixed = call->fresh = call->taken = 0;
  call->keep = 1;
  call->want = call->got = 0;
  call->len = 0;
  call->bytes = NULL;
}

void rl_call_init(rl_call *call, rl_cmd *cmd) {
  init(call, cmd, cmd->op == RL_OP_TAKE ? PH_TAKE : PH_SCRIPT);
}

void rl_call_init_command(rl_call *call, const char *bytes, size_t len, int resend) {
  init(call, NULL, PH_COMMAND);
  call->command = bytes;
  call->command_len = len;
  call->resend = resend;
}

void rl_call_init_args(rl_call *call, rl_args_cmd *args) {
  init(call, NULL, PH_ARGS);
  call->args = args;
  call->resend = args->op < RL_OP_COUNT && rl_op_resendable(args->op);
}

void rl_call_free(rl_call *call) {
  if (call->reply != NULL) freeReplyObject(call->reply);
  call->reply = NULL;
  drop_replies(call);
  drop_bytes(call);
}

/* Fails the call with "redis: <what><len bytes of msg>" (what may be "":
   msg is the server's error reply, and a cluster's redirect is read from it
   into call->redirect). */
static rl_step fail(rl_call *call, const char *what, const char *msg, size_t len) {
  rl_redirect rd;
  snprintf(call->err, sizeof call->err, "redis: %s%.*s", what, (int)len, msg);
  if (what[0] == '\0' && rl_parse_redirect(msg, len, &rd) != RL_NO_REDIRECT &&
      rd.hlen < sizeof call->redirect.host) {
    call->redirect.kind = rd.kind;
    call->redirect.slot = rd.slot;
    call->redirect.port = rd.port;
    memcpy(call->redirect.host, rd.host, rd.hlen);
    call->redirect.host[rd.hlen] = '\0';
  }
  return RL_STEP_FAILED;
}

static rl_step out_of_memory(rl_call *call) {
  call->keep = 0;
  snprintf(call->err, sizeof call->err, "connection: out of memory");
  return RL_STEP_FAILED;
}

/* An undo's bytes (see PH_UNDO): WATCH and GET of the lock, or MULTI, DEL
   and EXEC, in call->bytes (the stack's, or an allocation for a long
   name). 0, or -1 when out of memory. */
static int undo_bytes(rl_call *call) {
  static const char *const verbs[2][3] = { { "WATCH", "GET", NULL }, { "MULTI", "DEL", "EXEC" } };
  const char *argv[2];
  size_t alen[2], cap = 64 + 2 * call->cmd->len[3], used = 0;
  char *buf = cap <= sizeof call->stack ? call->stack : (char *)malloc(cap), *out;
  int i, set = call->phase == PH_UNDO_DEL;
  if (buf == NULL) return -1;
  argv[1] = call->cmd->argv[3]; /* the lock's name: an acquire's first key */
  alen[1] = call->cmd->len[3];
  for (i = 0; i < 3 && verbs[set][i] != NULL; i++) {
    long long n;
    argv[0] = verbs[set][i];
    alen[0] = strlen(argv[0]);
    n = rl_format(buf + used, cap - used, &out, i == 1 || !set ? 2 : 1, argv, alen);
    if (n < 0 || out != buf + used) { /* cap has room for them all: never */
      if (n >= 0) free(out);
      if (buf != call->stack) free(buf);
      return -1;
    }
    used += (size_t)n;
  }
  call->bytes = buf;
  call->len = (long long)used;
  call->want = i;
  return 0;
}

/* The bytes of the current phase, with pre (plen bytes) before a lock
   command's; want: the replies they are answered with. 0, or -1 when out
   of memory. */
static int make_bytes(rl_call *call) {
  char num[2][24];
  const char *pre = NULL, *argv[3] = { "WAIT", num[0], num[1] };
  size_t plen = 0, alen[3];
  char *body;
  long long n;
  drop_bytes(call);
  call->prefixed = 0;
  switch (call->phase) {
  case PH_UNDO:
  case PH_UNDO_DEL:
    return undo_bytes(call);
  case PH_WAIT:
    alen[0] = 4;
    alen[1] = (size_t)snprintf(num[0], sizeof num[0], "%lld", call->replicas);
    alen[2] = (size_t)snprintf(num[1], sizeof num[1], "%lld", call->replica_ms);
    call->len = rl_format(call->stack, sizeof call->stack, &call->bytes, 3, argv, alen);
    call->want = 1;
    return call->len < 0 ? -1 : 0;
  case PH_COMMAND:
  case PH_ARGS:
  case PH_SCRIPT:
    if (call->asking) {
      pre = ASKING;
      plen = sizeof ASKING - 1;
    }
    break;
  default:
    break;
  }
  call->prefixed = pre != NULL;
  call->want = (call->cmd != NULL ? rl_cmd_replies(call->cmd) : 1) + call->prefixed;
  if (plen > 0) memcpy(call->stack, pre, plen);
  if (call->cmd != NULL) {
    n = rl_cmd_bytes(call->cmd, call->stack + plen, sizeof call->stack - plen, &body);
  } else if (call->args != NULL) {
    n = rl_format(call->stack + plen, sizeof call->stack - plen, &body, call->args->argc, call->args->argv,
                  call->args->len);
  } else if (plen + call->command_len <= sizeof call->stack) {
    body = call->stack + plen;
    n = (long long)call->command_len;
    memcpy(body, call->command, call->command_len);
  } else {
    body = (char *)call->command; /* copied below, never freed */
    n = (long long)call->command_len;
  }
  if (n < 0) return -1;
  if (body == call->stack + plen) {
    call->bytes = call->stack;
  } else { /* EVAL with a script's text: prefix and body in one allocation */
    call->bytes = (char *)malloc(plen + (size_t)n);
    if (call->bytes != NULL) {
      if (plen > 0) memcpy(call->bytes, pre, plen);
      memcpy(call->bytes + plen, body, (size_t)n);
    }
    if (body != call->command) free(body);
    if (call->bytes == NULL) return -1;
  }
  call->len = (long long)plen + n;
  return 0;
}

/* The next bytes on this connection, or on another when it is out of step. */
static rl_step next_bytes(rl_call *call) {
  if (!call->keep) return RL_STEP_RECONNECT;
  if (make_bytes(call) != 0) return out_of_memory(call);
  call->fresh = 1;
  return RL_STEP_SEND;
}

rl_step rl_call_start(rl_call *call, int reused, redisReader *reader) {
  call->reused = reused;
  call->reader = reader;
  call->keep = 1;
  drop_replies(call);
  /* A transaction after ASKING is refused whole: the script instead. */
  if (call->phase == PH_TAKE && call->asking) {
    rl_cmd_use_acquire(call->cmd);
    call->phase = PH_SCRIPT;
  }
  return next_bytes(call);
}

const char *rl_call_bytes(const rl_call *call, size_t *len) {
  *len = (size_t)call->len;
  return call->bytes;
}

long long rl_call_read_ms(const rl_call *call) {
  /* The server may take replica_ms before it answers WAIT. */
  return call->phase == PH_WAIT ? call->timeout_ms + call->replica_ms : call->timeout_ms;
}

int rl_call_keep(const rl_call *call) {
  return call->keep;
}

/* The lock is ours: WAIT for replicas when asked, on this connection only
   (WAIT counts the writes of the connection it is sent on). */
static rl_step held(rl_call *call) {
  if (call->replicas == 0 || call->out.status != RL_HELD) return RL_STEP_DONE;
  if (!call->keep) {
    snprintf(call->wait_err, sizeof call->wait_err, "connection: lost the connection to %s before WAIT",
             call->where);
    return RL_STEP_DONE;
  }
  call->phase = PH_WAIT;
  return next_bytes(call);
}

/* Says what became of the failed call's take's lock, in call->left (which
   Lua gets beside the message: redislock/hold.lua sends no release after
   RL_LEFT_NOTHING): given back (RL_LEFT_NOTHING, said in words at the
   message's end too), or not (RL_LEFT_STAYING: the connection was lost,
   or the user may not WATCH or MULTI). hold.lua tries its release script
   then, which a new connection or other rights may let through, and says
   in words what that left. */
static void say_left(rl_call *call, rl_left left) {
  size_t used = strlen(call->err);
  call->left = left;
  if (left == RL_LEFT_NOTHING)
    snprintf(call->err + used, sizeof call->err - used, "%s", "; nothing its first try took is left");
}

const char *rl_left_name(rl_left left) {
  return left == RL_LEFT_NOTHING ? "nothing" : left == RL_LEFT_STAYING ? "staying" : NULL;
}

static rl_step undo_take(rl_call *call, int in_step);

/* The take's replies, decoded (d, with msg when it is an error). */
static rl_step after_take(rl_call *call, rl_decoded d, const char *msg) {
  if (d != RL_DECODED) {
    fail(call, "", msg, strlen(msg));
    rl_script_hint(call->err, sizeof call->err);
    call->taken = call->out.status == RL_UNTOLD; /* MULTI refused, SET took it alone */
    return undo_take(call, call->keep);
  }
  if (call->out.status == RL_HELD) return held(call);
  /* Held by another (the script tells its TTL and marks a waiter), or
     taken with a record that tells no fence (RL_UNTOLD): the script finds
     our token and tells one. */
  rl_cmd_use_acquire(call->cmd);
  call->taken = call->out.status == RL_UNTOLD; /* the lock holds our token */
  call->phase = PH_SCRIPT;
  return next_bytes(call);
}

/* The script after a take that took the lock failed (call->err says why):
   the take's lock must not stay held by nobody for its TTL. When the
   connection is in step (in_step), it is deleted if it still holds the
   take's token: WATCH and GET it, then MULTI, DEL, EXEC (plain commands: the
   script may be what the server refused). The call fails all the same. */
static rl_step undo_take(rl_call *call, int in_step) {
  if (!call->taken) return RL_STEP_FAILED;
  if (!in_step) {
    say_left(call, RL_LEFT_STAYING);
    return RL_STEP_FAILED;
  }
  call->keep = 1;
  call->phase = PH_UNDO;
  if (make_bytes(call) != 0) {
    call->keep = 0;
    return RL_STEP_FAILED;
  }
  call->fresh = 1;
  return RL_STEP_SEND;
}

/* The script's reply, decoded (d, with msg when it is an error). */
static rl_step after_script(rl_call *call, rl_decoded d, const char *msg) {
  int in_step = call->keep;
  if (d == RL_NOSCRIPT) {
    if (call->evaled) {
      fail(call, "NOSCRIPT after EVAL", "", 0);
      return undo_take(call, in_step);
    }
    call->evaled = 1;
    rl_cmd_use_eval(call->cmd); /* EVAL also caches the script for the next EVALSHA */
    return next_bytes(call);
  }
  if (d != RL_DECODED) {
    fail(call, "", msg, strlen(msg));
    rl_script_hint(call->err, sizeof call->err);
    return undo_take(call, in_step);
  }
  /* Sent with its first keys only, it needs them all (a release that
     found somebody waiting: its wake-up's names), having changed nothing:
     the same script again, with all of them, and so the next release of
     the name from the start, until one finds nobody waiting. */
  if (call->out.status == RL_HELD && call->out.value == RL_ALL_KEYS && rl_cmd_use_all_keys(call->cmd)) {
    rl_cmd_note_waiting(call->cmd, 1);
    return next_bytes(call);
  }
  if (call->out.status == RL_HELD && call->out.value == RL_NO_WAITERS && rl_cmd_note_waiting(call->cmd, 0))
    call->out.value = 1;
  return held(call);
}


/* WATCH's and GET's replies are in (PH_UNDO): the lock still holds the
   take's token (DEL it in a transaction, which the WATCH voids if the lock
   changes meanwhile), or it does not (nothing to undo; the connection,
   still watching, is closed). A refused WATCH leaves the lock to the
   caller (redislock/hold.lua tries the release script). */
static rl_step undo_watched(rl_call *call) {
  redisReply **r = call->r;
  const rl_cmd *cmd = call->cmd;
  int token = 3 + (cmd->numkeys[0] - '0');
  int watched = r[0]->type == REDIS_REPLY_STATUS;
  int ours = r[1]->type == REDIS_REPLY_STRING && r[1]->len == cmd->len[token] &&
             memcmp(r[1]->str, cmd->argv[token], r[1]->len) == 0;
  drop_replies(call);
  if (watched && !ours) say_left(call, RL_LEFT_NOTHING);
  if (!watched && ours) say_left(call, RL_LEFT_STAYING);
  if (!watched || !ours) {
    call->keep = 0; /* still watching */
    return RL_STEP_FAILED;
  }
  call->phase = PH_UNDO_DEL;
  if (make_bytes(call) != 0) {
    call->keep = 0;
    return RL_STEP_FAILED;
  }
  call->fresh = 1;
  return RL_STEP_SEND;
}

/* All the replies to the bytes are in: what they say. */
static rl_step replies_in(rl_call *call) {
  char msg[RL_ERRLEN - 8];
  redisReply **r = call->r;
  rl_decoded d;
  rl_step step;
  switch (call->phase) {
  case PH_TAKE:
    d = rl_decode_take(r, &call->out, msg, sizeof msg);
    drop_replies(call);
    return after_take(call, d, msg);
  case PH_UNDO:
    return undo_watched(call);
  case PH_UNDO_DEL:
    /* EXEC ran the DEL, or found the lock changed since WATCH: not ours.
       A refused MULTI ran the DEL alone, at once after GET found our token
       (only an expiry in between could make it another's). */
    if (r[2]->type == REDIS_REPLY_ARRAY || r[2]->type == REDIS_REPLY_NIL ||
        (r[0]->type == REDIS_REPLY_ERROR && r[1]->type == REDIS_REPLY_INTEGER))
      say_left(call, RL_LEFT_NOTHING);
    else
      say_left(call, RL_LEFT_STAYING);
    drop_replies(call);
    return RL_STEP_FAILED;
  case PH_WAIT:
    if (r[0]->type == REDIS_REPLY_INTEGER)
      call->acked = r[0]->integer;
    else
      snprintf(call->wait_err, sizeof call->wait_err, "redis: WAIT: %.*s",
               r[0]->type == REDIS_REPLY_ERROR ? (int)r[0]->len : 16,
               r[0]->type == REDIS_REPLY_ERROR ? r[0]->str : "unexpected reply");
    drop_replies(call);
    return RL_STEP_DONE;
  default:
    break;
  }
  if (call->prefixed && call->asking && r[0]->type == REDIS_REPLY_ERROR) {
    step = fail(call, "ASKING: ", r[0]->str, r[0]->len);
    drop_replies(call);
    return step;
  }
  if (call->phase == PH_ARGS && r[call->prefixed]->type == REDIS_REPLY_ERROR &&
      strncmp(r[call->prefixed]->str, "NOSCRIPT", 8) == 0 && !call->evaled) {
    call->evaled = 1;
    rl_args_use_eval(call->args); /* EVAL also caches the script for the next EVALSHA */
    drop_replies(call);
    return next_bytes(call);
  }
  if (call->phase == PH_COMMAND || call->phase == PH_ARGS) { /* its reply, error or not, is the caller's */
    call->reply = r[call->prefixed];
    call->got = call->prefixed; /* the ASKING's +OK stays to be dropped */
    drop_replies(call);
    return RL_STEP_DONE;
  }
  d = rl_decode(r[call->prefixed], &call->out, msg, sizeof msg);
  drop_replies(call);
  return after_script(call, d, msg);
}

rl_step rl_call_feed(rl_call *call, const char *in, size_t n) {
  redisReader *rd = call->reader;
  int fresh = call->fresh;
  call->fresh = 0;
  /* The common replies, read without the reader (no allocation): only the
     first read after a send, into an empty reader, and only when it holds
     the whole answer (a reply in pieces goes to the reader). */
  if (fresh && call->got == 0 && !call->prefixed && rd->pos == rd->len &&
      (call->phase == PH_TAKE || call->phase == PH_SCRIPT) &&
      rl_decode_bytes(in, n, call->phase == PH_TAKE, &call->out)) {
    call->reused = 1;
    return call->phase == PH_TAKE ? after_take(call, RL_DECODED, "") : after_script(call, RL_DECODED, "");
  }
  if (redisReaderFeed(rd, in, n) != REDIS_OK) return out_of_memory(call);
  while (call->got < call->want) {
    void *r = NULL;
    if (redisReaderGetReply(rd, &r) != REDIS_OK) {
      call->keep = 0;
      drop_replies(call);
      rl_read_error(rd->err, rd->errstr, call->where, call->err, sizeof call->err);
      return RL_STEP_FAILED;
    }
    if (r == NULL) return RL_STEP_READ;
    call->r[call->got++] = (redisReply *)r;
  }
  /* Bytes past the replies were asked for by no command: out of step. */
  if (rd->pos < rd->len) call->keep = 0;
  call->reused = 1; /* the connection answered: the next bytes go on a used one */
  return replies_in(call);
}

rl_step rl_call_lost(rl_call *call, int timeout, const char *msg) {
  int again = call->reused && !timeout && !call->resent;
  call->keep = 0;
  drop_replies(call);
  switch (call->phase) {
  case PH_TAKE:
    /* It may have landed: only the acquire script reconciles, never a take twice. */
    if (!again) break;
    call->resent = 1;
    rl_cmd_use_acquire(call->cmd);
    call->phase = PH_SCRIPT;
    return RL_STEP_RECONNECT;
  case PH_SCRIPT:
    /* The connection died while idle in the pool, or the server closed it
       while running the script: once more on another, when the script is
       safe to run twice (every one but the releases). Not after a timeout:
       the server is slow, and the caller's time bound must hold. */
    if (!again || !rl_op_resendable(call->cmd->op)) break;
    call->resent = 1;
    return RL_STEP_RECONNECT;
  case PH_UNDO:
  case PH_UNDO_DEL:
    /* The script's failure; the take's lock may stay (its release script
       may give it back on another connection). */
    if (call->taken) say_left(call, RL_LEFT_STAYING);
    return RL_STEP_FAILED;
  case PH_COMMAND:
  case PH_ARGS:
    if (!again || !call->resend) break;
    call->resent = 1;
    return RL_STEP_RECONNECT;
  default: /* PH_WAIT */
    snprintf(call->wait_err, sizeof call->wait_err, "%s", msg);
    return RL_STEP_DONE;
  }
  if (msg != call->err) snprintf(call->err, sizeof call->err, "%s", msg);
  return RL_STEP_FAILED;
}
