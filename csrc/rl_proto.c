/* SPDX-License-Identifier: MIT */
/* The lock protocol: the commands of the ops (rl_scripts.c has their
   scripts), reply decoding, and the checks of keys and times. */
#include "rl_ops.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The wake-up list of the primitive op belongs to. */
static int signal_of(rl_op op) {
  int i;
  for (i = 0; rl_ops[op].keys[i] >= 0; i++) {
    int k = rl_ops[op].keys[i];
    if (k == K_ERA) continue;
    if (k >= K_READERS) return K_RWSIGNAL;
    if (k >= K_PERMITS) return K_PSIGNAL;
  }
  return K_SIGNAL;
}

/* Writes n in decimal at p; returns the end. */
static char *put_long_size(char *p, size_t n) {
  char tmp[24];
  int i = 0;
  do tmp[i++] = (char)('0' + n % 10);
  while ((n /= 10) != 0);
  while (i > 0) *p++ = tmp[--i];
  return p;
}

/* put_long_size, with the lengths of names and arguments (below 100) in place. */
static inline char *put_size(char *p, size_t n) {
  if (n >= 100) return put_long_size(p, n);
  if (n >= 10) *p++ = (char)('0' + n / 10);
  *p++ = (char)('0' + n % 10);
  return p;
}

/* The names whose last release found somebody waiting (rl_cmd_note_waiting):
   their next release sends all its keys at once, sparing a contended
   lock's releases the second send. An entry is a name's hash (name_hash),
   0 for none; a collision only costs a release the other way. This is the
   one state the protocol keeps, process-wide: touched for ops with first
   only (the releases, never the watchdog's extends), with relaxed atomic
   loads and stores, so that two threads' releases (several Lua states in
   threads) racing on an entry likewise only send one the other way. */
static unsigned warm[256];

/* A name's hash for warm (FNV-1a), never 0. */
static unsigned name_hash(const char *s, size_t n) {
  unsigned h = 2166136261u;
  while (n-- > 0) h = (h ^ (unsigned char)*s++) * 16777619u;
  return h | 1u;
}

/* The longest tag of a fence record (rl_era_tag). */
#define ERA_TAG_MAX 4

/* Makes name i of cmd's row at cmd->fill: "<prefix>{<key>}" (as argv[3]
   begins, once it is made) and its suffix; the fence record's hash tag is
   its slot's tag, not the key. */
static void make_name(rl_cmd *cmd, int i, const char *prefix, const char *key) {
  int k = rl_ops[cmd->op].keys[i];
  size_t plen = cmd->plen, tl = cmd->uklen, slen = rl_key_suffix_len[k];
  char *p = cmd->fill;
  if (k != K_ERA && i > 0) { /* copied from the first name */
    memcpy(p, cmd->argv[3], plen + tl + 2);
  } else {
    const char *tag = key;
    if (k == K_ERA) {
      tag = rl_era_tag(rl_lock_slot(key, tl));
      tl = strlen(tag);
    }
    memcpy(p, prefix, plen);
    p[plen] = '{';
    memcpy(p + plen + 1, tag, tl);
    p[plen + 1 + tl] = '}';
  }
  memcpy(p + plen + 2 + tl, rl_key_suffix[k], slen);
  cmd->argv[3 + i] = cmd->key[k] = p;
  cmd->len[3 + i] = cmd->klen[k] = plen + tl + 2 + slen;
  cmd->fill = p + cmd->klen[k];
  cmd->made |= 1u << i;
}

/* Makes the names of cmd's row not made yet (see rl_cmd's made). */
static void make_rest(rl_cmd *cmd) {
  const signed char *keys = rl_ops[cmd->op].keys;
  for (int i = 0; keys[i] >= 0; i++)
    if (!(cmd->made & (1u << i))) make_name(cmd, i, cmd->argv[3], cmd->argv[3] + cmd->plen + 1);
}

int rl_cmd_init(rl_cmd *cmd, rl_op op, const char *prefix, size_t plen,
                const char *key, size_t klen, const char *token, size_t tlen,
                long long ms, long long n) {
  const signed char *keys = rl_ops[op].keys;
  size_t total = 0;
  int i, k, first = rl_ops[op].first;
  cmd->op = op;
  for (i = 0; (k = keys[i]) >= 0; i++) total += plen + (k == K_ERA ? ERA_TAG_MAX : klen) + 2 + rl_key_suffix_len[k];
  cmd->keys = cmd->fill = total <= sizeof cmd->inline_keys ? cmd->inline_keys : (char *)malloc(total);
  if (cmd->keys == NULL) return -1;
  cmd->made = 0;
  cmd->plen = plen;
  cmd->uklen = klen;
  /* "<prefix>{<key>}" then each name the op sends with its suffix, each an
     argument (KEYS) in the op's order: the first ones of a release (when
     the name's last release found nobody waiting: rl_cmd_bytes leaves the
     others out), the lock and its fence record of a take (the names of
     the acquire it falls back on are made then), else all. key[] and
     klen[] are set for the names made only. */
  for (i = 0; (k = keys[i]) >= 0; i++) {
    if (i == 0) {
      make_name(cmd, 0, prefix, key);
      if (first > 0) {
        unsigned h = name_hash(cmd->argv[3], cmd->len[3]);
        if (__atomic_load_n(&warm[h % 256], __ATOMIC_RELAXED) == h) first = 0;
      }
    } else if (op == RL_OP_TAKE ? k == K_ERA : first == 0 || i < first) {
      make_name(cmd, i, prefix, key);
    }
  }
  cmd->argv[0] = "EVALSHA";
  cmd->len[0] = 7;
  cmd->argv[1] = rl_script_sha(op); /* a take's: acquire's */
  cmd->len[1] = 40;
  /* One digit: RL_MAX_KEYS <= 9 (rl_proto.h). The first keys only, when
     the row says so (rl_cmd_bytes leaves the others out) and the name's
     last release found nobody waiting. */
  cmd->numkeys[0] = (char)('0' + (first > 0 ? first : i));
  cmd->numkeys[1] = '\0';
  cmd->argv[2] = cmd->numkeys;
  cmd->len[2] = 1;
  cmd->argc = 3 + i;
  cmd->argv[cmd->argc] = token;
  cmd->len[cmd->argc++] = tlen;
  if (rl_op_takes_ms(op)) {
    cmd->len[cmd->argc] = (size_t)(put_size(cmd->ms, (size_t)ms) - cmd->ms); /* ms >= 1, checked */
    cmd->argv[cmd->argc++] = cmd->ms;
  }
  if (rl_op_takes_n(op)) {
    cmd->len[cmd->argc] = (size_t)(put_size(cmd->n, (size_t)n) - cmd->n); /* n >= 1, checked */
    cmd->argv[cmd->argc++] = cmd->n;
  }
  if ((rl_ops[op].flags & RL_F_STAY)) {
    cmd->argv[cmd->argc] = RL_STR(RL_FAIR_STAY_MS);
    cmd->len[cmd->argc++] = sizeof RL_STR(RL_FAIR_STAY_MS) - 1;
  }
  return 0;
}

int rl_wait_init(rl_cmd *cmd, rl_op op, const char *prefix, size_t plen, const char *key, size_t klen,
                 const char *token, size_t tlen, long long ms) {
  const char *signal = rl_key_suffix[signal_of(op)];
  size_t slen = strlen(signal);
  size_t base = plen + klen + 2 + slen;
  size_t len = base + (token != NULL ? 1 + tlen : 0);
  char *p;
  memset(cmd, 0, offsetof(rl_cmd, inline_keys));
  cmd->op = RL_OP_COUNT; /* not a script */
  cmd->keys = p = len <= sizeof cmd->inline_keys ? cmd->inline_keys : (char *)malloc(len);
  if (p == NULL) return -1;
  memcpy(p, prefix, plen);
  p[plen] = '{';
  memcpy(p + plen + 1, key, klen);
  p[plen + 1 + klen] = '}';
  memcpy(p + plen + 2 + klen, signal, slen);
  if (token != NULL) {
    p[base] = ':';
    memcpy(p + base + 1, token, tlen);
  }
  if (ms < 1) ms = 1; /* BLPOP 0 would block for ever */
  cmd->argv[0] = "BLPOP";
  cmd->len[0] = 5;
  cmd->argv[1] = p;
  cmd->len[1] = len;
  {
    char *e = put_size(cmd->ms, (size_t)(ms / 1000)); /* seconds with a fraction, "%lld.%03lld" */
    *e++ = '.';
    *e++ = (char)('0' + ms % 1000 / 100), *e++ = (char)('0' + ms % 100 / 10), *e++ = (char)('0' + ms % 10);
    cmd->len[2] = (size_t)(e - cmd->ms);
  }
  cmd->argv[2] = cmd->ms;
  cmd->argc = 3;
  return 0;
}

/* Decimal digits of n. */
static size_t digits(size_t n) {
  size_t d = 1;
  if (n < 10) return 1;
  if (n < 100) return 2;
  while (n >= 10) n /= 10, d++;
  return d;
}

long long rl_format(char *buf, size_t cap, char **out, int argc, const char *const *argv, const size_t *len) {
  size_t total = 0, most = 24; /* the longest count has 20 digits */
  char *p, *start;
  for (int i = 0; i < argc; i++) most += 25 + len[i];
  if (most <= cap) { /* the usual command: one pass, its length counted as it is written */
    p = buf;
  } else {
    total = 1 + digits((size_t)argc) + 2;
    for (int i = 0; i < argc; i++) total += 1 + digits(len[i]) + 2 + len[i] + 2;
    p = total <= cap ? buf : (char *)malloc(total);
    if (p == NULL) return -1;
  }
  *out = start = p;
  *p++ = '*';
  p = put_size(p, (size_t)argc);
  *p++ = '\r', *p++ = '\n';
  for (int i = 0; i < argc; i++) {
    *p++ = '$';
    p = put_size(p, len[i]);
    *p++ = '\r', *p++ = '\n';
    if (len[i] > 0) memcpy(p, argv[i], len[i]);
    p += len[i];
    *p++ = '\r', *p++ = '\n';
  }
  return (long long)(p - start);
}

/* Writes "$<len>\r\n<bytes>\r\n" at p; returns the end. */
static char *put_bulk(char *p, const char *bytes, size_t len) {
  *p++ = '$';
  p = put_size(p, len);
  *p++ = '\r', *p++ = '\n';
  memcpy(p, bytes, len);
  p += len;
  *p++ = '\r', *p++ = '\n';
  return p;
}

/* A take's bytes: its four commands, in one buffer (the caller frees *out
   when it is not buf). The argv of a take is acquire's EVALSHA sha 4 lock
   fence waiters era token ms. */
static long long take_bytes(const rl_cmd *cmd, char *buf, size_t cap, char **out) {
  static const char multi[] = "*1\r\n$5\r\nMULTI\r\n", set_head[] = "*6\r\n$3\r\nSET\r\n";
  static const char set_tail[] = "$2\r\nNX\r\n$2\r\nPX\r\n", xadd_head[] = "*7\r\n$4\r\nXADD\r\n";
  static const char xadd_tail[] = "$6\r\nMAXLEN\r\n$1\r\n0\r\n$1\r\n*\r\n$1\r\nf\r\n$1\r\n1\r\n";
  static const char exec[] = "*1\r\n$4\r\nEXEC\r\n";
  const char *token = cmd->argv[7], *ms = cmd->argv[8];
  size_t tlen = cmd->len[7], mlen = cmd->len[8];
  size_t lock = cmd->klen[K_LOCK], rec = cmd->klen[K_ERA];
  size_t total = sizeof multi - 1 + sizeof set_head - 1 + 1 + digits(lock) + 2 + lock + 2 +
                 1 + digits(tlen) + 2 + tlen + 2 + sizeof set_tail - 1 + 1 + digits(mlen) + 2 + mlen + 2 +
                 sizeof xadd_head - 1 + 1 + digits(rec) + 2 + rec + 2 + sizeof xadd_tail - 1 + sizeof exec - 1;
  char *p = total <= cap ? buf : (char *)malloc(total);
  if (p == NULL) return -1;
  *out = p;
  memcpy(p, multi, sizeof multi - 1), p += sizeof multi - 1;
  memcpy(p, set_head, sizeof set_head - 1), p += sizeof set_head - 1;
  p = put_bulk(p, cmd->key[K_LOCK], lock);
  p = put_bulk(p, token, tlen);
  memcpy(p, set_tail, sizeof set_tail - 1), p += sizeof set_tail - 1;
  p = put_bulk(p, ms, mlen);
  memcpy(p, xadd_head, sizeof xadd_head - 1), p += sizeof xadd_head - 1;
  p = put_bulk(p, cmd->key[K_ERA], rec);
  memcpy(p, xadd_tail, sizeof xadd_tail - 1), p += sizeof xadd_tail - 1;
  memcpy(p, exec, sizeof exec - 1);
  return (long long)total;
}

/* The keys of op's row. */
static int row_keys(rl_op op) {
  int i = 0;
  while (rl_ops[op].keys[i] >= 0) i++;
  return i;
}

long long rl_cmd_bytes(const rl_cmd *cmd, char *buf, size_t cap, char **out) {
  const char *argv[RL_CMD_MAXARGS];
  size_t len[RL_CMD_MAXARGS];
  int first, skip, i, n = 0;
  if (cmd->op == RL_OP_TAKE) return take_bytes(cmd, buf, cap, out);
  first = cmd->op < RL_OP_COUNT ? rl_ops[cmd->op].first : 0;
  if (first == 0 || cmd->numkeys[0] - '0' != first) return rl_format(buf, cap, out, cmd->argc, cmd->argv, cmd->len);
  /* The first send: the first keys, then the arguments after them all. */
  skip = row_keys(cmd->op) - first;
  for (i = 0; i < cmd->argc; i++) {
    if (i >= 3 + first && i < 3 + first + skip) continue;
    argv[n] = cmd->argv[i];
    len[n++] = cmd->len[i];
  }
  return rl_format(buf, cap, out, n, argv, len);
}

int rl_cmd_note_waiting(const rl_cmd *cmd, int waiting) {
  unsigned h;
  if (cmd->op >= RL_OP_COUNT || rl_ops[cmd->op].first == 0) return 0;
  h = name_hash(cmd->argv[3], cmd->len[3]);
  if (waiting)
    __atomic_store_n(&warm[h % 256], h, __ATOMIC_RELAXED);
  else if (__atomic_load_n(&warm[h % 256], __ATOMIC_RELAXED) == h)
    __atomic_store_n(&warm[h % 256], 0u, __ATOMIC_RELAXED);
  return 1;
}

int rl_cmd_use_all_keys(rl_cmd *cmd) {
  if (cmd->op >= RL_OP_COUNT || rl_ops[cmd->op].first == 0 || cmd->numkeys[0] - '0' != rl_ops[cmd->op].first)
    return 0;
  cmd->numkeys[0] = (char)('0' + row_keys(cmd->op));
  make_rest(cmd);
  return 1;
}

int rl_cmd_replies(const rl_cmd *cmd) {
  return cmd->op == RL_OP_TAKE ? RL_TAKE_REPLIES : 1;
}

void rl_cmd_use_acquire(rl_cmd *cmd) {
  if (cmd->op != RL_OP_TAKE) return;
  cmd->op = RL_OP_ACQUIRE; /* argv is acquire's already, its names made now */
  make_rest(cmd);
}

void rl_cmd_use_eval(rl_cmd *cmd) {
  rl_cmd_use_acquire(cmd);
  cmd->argv[0] = "EVAL";
  cmd->len[0] = 4;
  cmd->argv[1] = rl_ops[cmd->op].script;
  cmd->len[1] = strlen(rl_ops[cmd->op].script);
}

void rl_cmd_free(rl_cmd *cmd) {
  if (cmd->keys != cmd->inline_keys) free(cmd->keys);
  cmd->keys = NULL;
}

/* Writes the name k (rl_ops.h) of the lock on key under prefix at p, when
   p is not NULL; returns its length. The fence record's hash tag is its
   slot's tag (rl_era_tag), not the key. */
static size_t put_name(char *p, int k, const char *prefix, size_t plen, const char *key, size_t klen) {
  const char *tag = k == K_ERA ? rl_era_tag(rl_lock_slot(key, klen)) : key;
  size_t tlen = k == K_ERA ? strlen(tag) : klen, slen = strlen(rl_key_suffix[k]);
  if (p != NULL) {
    memcpy(p, prefix, plen);
    p[plen] = '{';
    memcpy(p + plen + 1, tag, tlen);
    p[plen + 1 + tlen] = '}';
    memcpy(p + plen + 2 + tlen, rl_key_suffix[k], slen);
  }
  return plen + tlen + 2 + slen;
}

/* Copies n bytes of s to *p as argument i of a; moves *p past them. */
static void put_arg(rl_args_cmd *a, int i, char **p, const char *s, size_t n) {
  if (n > 0) memcpy(*p, s, n);
  a->argv[i] = *p;
  a->len[i] = n;
  *p += n;
}

int rl_args_init(rl_args_cmd *a, rl_op op, const char *text, size_t tlen, const char *sha, const char *prefix,
                 size_t plen, int nkeys, const char *const *keys, const size_t *klen,
                 int nargs, const char *const *args, const size_t *alen) {
  int named = rl_args_named(op), nrow = 0, nnames, i, j, at;
  size_t bytes = 0;
  char *p;
  memset(a, 0, sizeof *a);
  a->op = op;
  if (op == RL_OP_COUNT && (text == NULL || sha == NULL)) return -1; /* a guard's comes with both */
  if (text == NULL) tlen = 0;
  if (!named)
    while (rl_ops[op].keys[nrow] >= 0) nrow++;
  nnames = named ? nkeys : nrow * nkeys;
  for (i = 0; i < nkeys; i++)
    for (j = 0; j < (named ? 1 : nrow); j++)
      bytes += named ? klen[i] : put_name(NULL, rl_ops[op].keys[j], prefix, plen, keys[i], klen[i]);
  for (i = 0; i < nargs; i++) bytes += alen[i];
  a->argc = 3 + nnames + nargs;
  a->mem = (char *)malloc((size_t)a->argc * (sizeof *a->argv + sizeof *a->len) + bytes + tlen);
  if (a->mem == NULL) return -1;
  a->argv = (const char **)(void *)a->mem;
  a->len = (size_t *)(void *)(a->argv + a->argc);
  p = (char *)(a->len + a->argc);
  snprintf(a->sha, sizeof a->sha, "%s", sha != NULL ? sha : rl_script_sha(op));
  if (text != NULL) { /* a guard's: it lives as long as the command */
    memcpy(p, text, tlen);
    a->text = p;
    a->text_len = tlen;
    p += tlen;
  } else {
    a->text = rl_script_text(op);
    a->text_len = strlen(a->text);
  }
  a->argv[0] = "EVALSHA";
  a->argv[1] = a->sha;
  a->argv[2] = a->numkeys;
  a->len[2] = (size_t)(put_size(a->numkeys, (size_t)nnames) - a->numkeys);
  at = 3;
  /* Every name made of the first row key, then every one of the second ... */
  for (j = 0; j < (named ? 1 : nrow); j++) {
    for (i = 0; i < nkeys; i++) {
      if (named) {
        put_arg(a, at++, &p, keys[i], klen[i]);
      } else {
        size_t n = put_name(p, rl_ops[op].keys[j], prefix, plen, keys[i], klen[i]);
        a->argv[at] = p;
        a->len[at++] = n;
        p += n;
      }
    }
  }
  for (i = 0; i < nargs; i++) put_arg(a, at++, &p, args[i], alen[i]);
  a->len[0] = strlen(a->argv[0]);
  a->len[1] = strlen(a->argv[1]);
  return 0;
}

void rl_args_use_eval(rl_args_cmd *a) {
  a->argv[0] = "EVAL";
  a->len[0] = 4;
  a->argv[1] = a->text;
  a->len[1] = a->text_len;
}

void rl_args_free(rl_args_cmd *a) {
  free(a->mem);
  a->mem = NULL;
  a->argv = NULL;
  a->len = NULL;
}

/* Copies what (len bytes) into err as a C string; returns RL_ERROR. */
static rl_decoded fail(char *err, size_t errlen, const char *what, size_t len) {
  if (errlen > 0) snprintf(err, errlen, "%.*s", (int)len, what);
  return RL_ERROR;
}

void rl_read_error(int err, const char *errstr, const char *where, char *out, size_t len) {
  /* hiredis 0.14's reader keeps a fixed stack of 8 levels (REDIS_ERR_PROTOCOL). */
  if (err == REDIS_ERR_PROTOCOL && strstr(errstr, "nested") != NULL)
    snprintf(out, len, "redis: the reply%s%s nests arrays deeper than hiredis 0.14 can read"
             " (8 levels at most; %s)", where ? " of " : "", where ? where : "", errstr);
  else if (where != NULL)
    snprintf(out, len, "connection: the reply of %s is not RESP (%s)", where, errstr);
  else
    snprintf(out, len, "connection: the server's reply is not RESP (%s)", errstr);
}

void rl_io_message(rl_io_failure f, const char *where, const char *why, long long timeout_ms, char *out,
                   size_t len) {
  if (f == RL_IO_TIMEOUT)
    snprintf(out, len, "connection: %s did not answer within %g s (timeout)", where, (double)timeout_ms / 1000.0);
  else if (f == RL_IO_CLOSED)
    snprintf(out, len, "connection: %s closed the connection", where);
  else
    snprintf(out, len, "connection: lost %s (%s)", where, why);
}

/* The server's error codes that decide something, and their classes: the
   one table of them (rl_error_class). Every other code is RL_EC_REDIS. */
#define CODE(s, c) { s, sizeof s - 1, c }
static const struct {
  const char *code;
  size_t len;
  rl_error_class class;
} CODES[] = {
  CODE("LOADING", RL_EC_TRANSIENT),       CODE("BUSY", RL_EC_TRANSIENT),   CODE("READONLY", RL_EC_STALE),
  CODE("MASTERDOWN", RL_EC_STALE),        CODE("UNBLOCKED", RL_EC_STALE),  CODE("TRYAGAIN", RL_EC_TRYAGAIN),
  CODE("CLUSTERDOWN", RL_EC_CLUSTERDOWN), CODE("MOVED", RL_EC_REDIRECT),   CODE("ASK", RL_EC_REDIRECT),
  CODE("NOPERM", RL_EC_REFUSED),          CODE("NOSCRIPT", RL_EC_REFUSED), CODE("OOM", RL_EC_REFUSED),
};
#undef CODE

static const char *const CLASS_NAMES[] = { NULL,      "busy",    "lost",     "transient", "stale",
                                           "demoted", "tryagain", "clusterdown", "redirect", "refused",
                                           "script",  "redis",   "connect",  "unsent",    "timeout",
                                           "closed",  "connection", "unnamed" };
/* One name a class, in rl_error_class's order (core.error_class indexes them). */
typedef char rl_class_names_check[sizeof CLASS_NAMES / sizeof CLASS_NAMES[0] == RL_EC_COUNT ? 1 : -1];

/* Whether the len bytes at s begin with the C string p. */
static int starts(const char *s, size_t len, const char *p) {
  size_t n = strlen(p);
  return len >= n && memcmp(s, p, n) == 0;
}

/* Whether the len bytes at s end with the C string p. */
static int ends(const char *s, size_t len, const char *p) {
  size_t n = strlen(p);
  return len >= n && memcmp(s + len - n, p, n) == 0;
}

/* Whether the C string p is within the len bytes at s. */
static int within(const char *s, size_t len, const char *p) {
  size_t n = strlen(p);
  for (size_t i = 0; i + n <= len; i++)
    if (memcmp(s + i, p, n) == 0) return 1;
  return 0;
}

/* A "connection: ..." message's class, from how rl_io_message and the
   connects word it (rest: what follows "connection: "). */
static rl_error_class connection_class(const char *rest, size_t len) {
  if (starts(rest, len, "cannot connect")) return RL_EC_CONNECT;
  if (ends(rest, len, "(nothing was sent)")) return RL_EC_UNSENT; /* rl_conn_lost's, behind Sentinel */
  if (ends(rest, len, "(timeout)")) return RL_EC_TIMEOUT;
  if (starts(rest, len, "lost ") || within(rest, len, " closed the connection")) return RL_EC_CLOSED;
  return RL_EC_CONNECTION;
}

/* A "redis: ..." message's class (rest: the server's error reply, or our
   sentence about it), from its code: the capital letters it begins with. */
static rl_error_class reply_class(const char *rest, size_t len) {
  rl_error_class c = RL_EC_REDIS;
  size_t n = 0;
  if (ends(rest, len, "(nothing was sent)")) return RL_EC_DEMOTED; /* the cosocket transport's NOT_MASTER */
  if (starts(rest, len, "no sentinel knows master")) return RL_EC_UNNAMED; /* sentinel.lua's */
  while (n < len && rest[n] >= 'A' && rest[n] <= 'Z') n++;
  for (size_t i = 0; i < sizeof CODES / sizeof CODES[0]; i++)
    if (CODES[i].len == n && memcmp(rest, CODES[i].code, n) == 0) c = CODES[i].class;
  /* A refusal named by a script's line met a command within it, after
     what ran before; the states (READONLY ...) refuse every write. */
  if ((c == RL_EC_REDIS || c == RL_EC_REFUSED) && within(rest, len, "@user_script")) return RL_EC_SCRIPT;
  return c;
}

/* Whether the len bytes at s begin with the code word word (with its colon,
   and a space after it or not); then *rest and *rlen are what follows. */
static int code_word(const char *s, size_t len, const char *word, const char **rest, size_t *rlen) {
  size_t n = strlen(word);
  if (!starts(s, len, word)) return 0;
  if (n < len && s[n] == ' ') n++;
  *rest = s + n;
  *rlen = len - n;
  return 1;
}

rl_error_class rl_error_class_of(const char *msg, size_t len) {
  const char *rest;
  size_t n;
  if (code_word(msg, len, "redis:", &rest, &n)) return reply_class(rest, n);
  if (code_word(msg, len, "connection:", &rest, &n)) return connection_class(rest, n);
  if (code_word(msg, len, "busy:", &rest, &n)) return RL_EC_BUSY;
  if (code_word(msg, len, "lost:", &rest, &n)) return RL_EC_LOST;
  return RL_EC_NONE;
}

const char *rl_error_class_name(rl_error_class c) {
  return (size_t)c < sizeof CLASS_NAMES / sizeof CLASS_NAMES[0] ? CLASS_NAMES[c] : NULL;
}

const char *rl_error_code(size_t i, rl_error_class *c) {
  if (i >= sizeof CODES / sizeof CODES[0]) return NULL;
  *c = CODES[i].class;
  return CODES[i].code;
}

/* Reads ":<integer>\r\n" at *p (before end) into *v, moving *p past it; 0 or -1. */
static int read_int_line(const char **p, const char *end, long long *v) {
  const char *s = *p;
  int neg = 0, nd = 0;
  unsigned long long n = 0;
  if (s >= end || *s++ != ':') return -1;
  if (s < end && *s == '-') neg = 1, s++;
  while (s < end && *s >= '0' && *s <= '9') {
    if (++nd > 18) return -1; /* leave the rare giant to the reader */
    n = n * 10 + (unsigned)(*s++ - '0');
  }
  if (nd == 0 || end - s < 2 || s[0] != '\r' || s[1] != '\n') return -1;
  *v = neg ? -(long long)n : (long long)n;
  *p = s + 2;
  return 0;
}

/* A script's one-integer reply n as a result (see rl_result). */
static void from_integer(long long n, rl_result *out) {
  out->status = n >= 1 ? RL_HELD : n == 0 ? RL_FREE : RL_OTHER;
  out->value = n >= 1 ? n : n == 0 ? 0 : -n - 2;
}

/*
 * A take's result from what its transaction answered: held (SET took the
 * lock), and the fence record's new ID (idlen bytes at id; NULL when XADD
 * was refused). See "Fences": the fence is (ms - RL_FENCE_EPOCH_MS) *
 * RL_FENCE_SCALE + seq when the ID "<ms>-<seq>" has seq below
 * RL_FENCE_SCALE and ms is not before the epoch; else none (RL_UNTOLD).
 */
static void take_result(int held, const char *id, size_t idlen, rl_result *out) {
  long long ms = 0, seq = 0;
  size_t i = 0;
  if (!held) {
    out->status = RL_OTHER;
    out->value = RL_PTTL_UNKNOWN;
    return;
  }
  out->status = RL_UNTOLD;
  out->value = 0;
  if (id == NULL) return;
  while (i < idlen && i < 15 && id[i] >= '0' && id[i] <= '9') ms = ms * 10 + (id[i++] - '0');
  if (i == 0 || i >= idlen || id[i++] != '-' || i == idlen || idlen - i > 2) return;
  while (i < idlen && id[i] >= '0' && id[i] <= '9') seq = seq * 10 + (id[i++] - '0');
  if (i != idlen || seq >= RL_FENCE_SCALE || ms < RL_FENCE_EPOCH_MS) return;
  out->status = RL_HELD;
  out->value = (ms - RL_FENCE_EPOCH_MS) * RL_FENCE_SCALE + seq;
}

/* Reads "$<len>\r\n<bytes>\r\n" at *p (before end): *s and *slen, moving
   *p past it; 0 or -1. */
static int read_bulk(const char **p, const char *end, const char **s, size_t *slen) {
  const char *q = *p;
  size_t n = 0;
  int nd = 0;
  if (q >= end || *q++ != '$') return -1;
  while (q < end && *q >= '0' && *q <= '9' && nd < 6) n = n * 10 + (size_t)(*q++ - '0'), nd++;
  if (nd == 0 || end - q < 2 || q[0] != '\r' || q[1] != '\n') return -1;
  q += 2;
  if ((size_t)(end - q) < n + 2 || q[n] != '\r' || q[n + 1] != '\n') return -1;
  *s = q, *slen = n, *p = q + n + 2;
  return 0;
}

int rl_decode_bytes(const char *buf, size_t len, int take, rl_result *out) {
  /* MULTI's and the QUEUEDs, then EXEC's array */
  static const char head[] = "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n";
  const char *p = buf, *end = buf + len;
  long long status, value;
  if (take) {
    const char *id;
    size_t idlen;
    int held;
    if (len < sizeof head - 1 + 5 || memcmp(p, head, sizeof head - 1) != 0) return 0;
    p += sizeof head - 1;
    if (memcmp(p, "+OK\r\n", 5) == 0) held = 1;
    else if (memcmp(p, "$-1\r\n", 5) == 0) held = 0;
    else return 0;
    p += 5;
    if (read_bulk(&p, end, &id, &idlen) != 0 || p != end) return 0;
    take_result(held, id, idlen, out);
    return 1;
  }
  if (len > 0 && buf[0] == ':') {
    if (read_int_line(&p, end, &value) != 0 || p != end) return 0;
    from_integer(value, out);
    return 1;
  }
  if (len < 4 || memcmp(buf, "*2\r\n", 4) != 0) return 0;
  p += 4;
  if (read_int_line(&p, end, &status) != 0 || read_int_line(&p, end, &value) != 0 || p != end) return 0;
  if (status < RL_OTHER || status > RL_HELD) return 0;
  out->status = (int)status;
  out->value = value;
  return 1;
}

rl_decoded rl_decode(const redisReply *r, rl_result *out, char *err, size_t errlen) {
  static const char bad[] = "unexpected reply to a redislock script";
  if (r->type == REDIS_REPLY_ERROR) {
    if (r->len >= 8 && memcmp(r->str, "NOSCRIPT", 8) == 0) return RL_NOSCRIPT;
    return fail(err, errlen, r->str, r->len);
  }
  if (r->type == REDIS_REPLY_INTEGER) {
    from_integer(r->integer, out);
    return RL_DECODED;
  }
  if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
      r->element[0]->type != REDIS_REPLY_INTEGER ||
      r->element[1]->type != REDIS_REPLY_INTEGER ||
      r->element[0]->integer < RL_OTHER || r->element[0]->integer > RL_HELD)
    return fail(err, errlen, bad, sizeof bad - 1);
  out->status = (int)r->element[0]->integer;
  out->value = r->element[1]->integer;
  return RL_DECODED;
}

rl_decoded rl_decode_take(redisReply *const *r, rl_result *out, char *err, size_t errlen) {
  static const char bad[] = "unexpected reply to MULTI/EXEC of a take";
  const redisReply *exec = r[RL_TAKE_REPLIES - 1], *set, *id;
  /* A refused MULTI (a user without +multi) leaves SET to run alone: when
     it took the lock, the take is RL_UNTOLD all the same (the caller gives
     the lock back). */
  if (r[0]->type == REDIS_REPLY_ERROR && r[1]->type == REDIS_REPLY_STATUS) out->status = RL_UNTOLD;
  for (int i = 0; i < RL_TAKE_REPLIES; i++)
    if (r[i]->type == REDIS_REPLY_ERROR) return fail(err, errlen, r[i]->str, r[i]->len);
  if (exec->type != REDIS_REPLY_ARRAY || exec->elements != 2) return fail(err, errlen, bad, sizeof bad - 1);
  set = exec->element[0], id = exec->element[1];
  if (set->type == REDIS_REPLY_ERROR) return fail(err, errlen, set->str, set->len);
  if ((set->type != REDIS_REPLY_STATUS && set->type != REDIS_REPLY_NIL) ||
      (id->type != REDIS_REPLY_STRING && id->type != REDIS_REPLY_ERROR))
    return fail(err, errlen, bad, sizeof bad - 1);
  /* A refused XADD leaves the fence to the acquire script, whose own
     refusal then says why. */
  take_result(set->type == REDIS_REPLY_STATUS, id->type == REDIS_REPLY_STRING ? id->str : NULL,
              id->type == REDIS_REPLY_STRING ? id->len : 0, out);
  return RL_DECODED;
}

const char *rl_check_key(const char *key, size_t len) {
  (void)key;
  if (len == 0) return "key must not be empty";
  /* "<prefix>{}..." would make an empty hash tag: Redis Cluster would then hash
     the whole names and put the lock and its other names on different slots. */
  if (key[0] == '}') return "key must not start with '}'";
  return NULL;
}

const char *rl_check_prefix(const char *prefix, size_t len) {
  /* A brace in the prefix would decide the hash tag instead of the key's
     braces: "x{}" empties it, "{app}" puts every lock on one slot. */
  if (memchr(prefix, '{', len) != NULL || memchr(prefix, '}', len) != NULL)
    return "must not contain '{' or '}'";
  return NULL;
}

const char *rl_seconds_to_ms(double seconds, long long *ms) {
  double scaled;
  if (seconds != seconds) return "must be a number, not NaN";
  if (seconds - seconds != 0) return "must be finite";
  if (seconds <= 0) return "must be > 0";
  scaled = seconds * 1000.0 + 0.5;
  if (scaled > (double)RL_MAX_MS) return "must be at most 9007199254740.992 (2^53 ms, about 285,000 years)";
  if (scaled < 1.0) return "must be at least 0.001 (1 ms)";
  *ms = (long long)scaled;
  return NULL;
}


/* The text and name of the script whose SHA-1 is the 40 hex digits at
   sha (an op's: every script the core sends is one), or NULL. */
static const char *script_by_sha(const char *sha, const char **name) {
  int i;
  for (i = 0; i < RL_OP_COUNT; i++) {
    if (i == RL_OP_TAKE || memcmp(rl_script_sha((rl_op)i), sha, 40) != 0) continue;
    *name = rl_op_name((rl_op)i);
    return rl_script_text((rl_op)i);
  }
  return NULL;
}

void rl_script_hint(char *err, size_t cap) {
  static const char on_line[] = ", on @user_script:";
  const char *at = strstr(err, "script: "), *text, *name = NULL, *p, *eol, *cmd = NULL;
  size_t used = strlen(err), n;
  long line = 0;
  char lower[33];
  if (at == NULL || strncmp(at + 8 + 40, on_line, sizeof on_line - 1) != 0) return;
  if (strstr(err, "can't run this command") == NULL && strstr(err, "Unknown Redis command") == NULL) return;
  for (p = at + 8 + 40 + sizeof on_line - 1; *p >= '0' && *p <= '9' && line < 100000; p++)
    line = line * 10 + (*p - '0');
  if (line < 1 || (text = script_by_sha(at + 8, &name)) == NULL) return;
  for (p = text; --line > 0; p++) /* the start of the line the server named */
    if ((p = strchr(p, '\n')) == NULL) return;
  eol = strchr(p, '\n');
  if (eol == NULL) eol = p + strlen(p);
  for (; p < eol && cmd == NULL; p++) {
    if (strncmp(p, "redis.call('", 12) == 0) cmd = p + 12;
    else if (strncmp(p, "redis.pcall('", 13) == 0) cmd = p + 13;
  }
  if (cmd == NULL) return;
  for (n = 0; cmd + n < eol && cmd[n] != '\'' && n < sizeof lower - 1; n++)
    lower[n] = (char)(cmd[n] >= 'A' && cmd[n] <= 'Z' ? cmd[n] - 'A' + 'a' : cmd[n]);
  if (cmd + n >= eol || cmd[n] != '\'') return;
  lower[n] = '\0';
  if (used > 0 && err[used - 1] == '.') used--;
  snprintf(err + used, cap - used, " (redislock's %s script calls %.*s there: the Redis user needs +%s,"
           " and the server must not rename %.*s away)", name, (int)n, cmd, lower, (int)n, cmd);
}
