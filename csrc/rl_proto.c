/* SPDX-License-Identifier: MIT */
/* The lock protocol: scripts, command arguments, reply decoding, tokens, checks. */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* getrandom, O_CLOEXEC under -std=c99 */
#endif
#include "rl_proto.h"
#include "rl_sha1.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/random.h>
#endif

/*
 * The scripts. Keys and tokens arrive only as KEYS/ARGV, never in the text.
 * Each replies {status, value} with status 1 (ours), 0 (no key), -1 (another
 * owner's). KEYS[1] is the lock, KEYS[2] its fence counter (acquire only); the
 * two share a hash tag, so Redis Cluster runs them on one node.
 *
 * acquire is resend-safe: if the key already holds our token (an earlier send
 * that timed out did land), it refreshes the TTL and answers the fence that
 * acquisition took, which is still the counter's value because only a
 * successful SET NX increments it, and the lock has been ours since. Should the
 * counter have vanished meanwhile (FLUSHDB, eviction), it takes a new value
 * rather than answer 0.
 */
static const char *const script_text[RL_OP_COUNT] = {
  /* RL_OP_ACQUIRE: ARGV[1] token, ARGV[2] ttl (ms) */
  "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then\n"
  "  return {1, redis.call('INCR', KEYS[2])}\n"
  "end\n"
  "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
  "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
  "  local fence = redis.call('GET', KEYS[2])\n"
  "  if fence then return {1, tonumber(fence)} end\n"
  "  return {1, redis.call('INCR', KEYS[2])}\n"
  "end\n"
  "return {-1, redis.call('PTTL', KEYS[1])}\n",
  /* RL_OP_RELEASE: ARGV[1] token */
  "local v = redis.call('GET', KEYS[1])\n"
  "if v == ARGV[1] then\n"
  "  redis.call('DEL', KEYS[1])\n"
  "  return {1, 0}\n"
  "end\n"
  "if v then return {-1, redis.call('PTTL', KEYS[1])} end\n"
  "return {0, 0}\n",
  /* RL_OP_EXTEND: ARGV[1] token, ARGV[2] ttl (ms) */
  "local v = redis.call('GET', KEYS[1])\n"
  "if v == ARGV[1] then\n"
  "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
  "  return {1, tonumber(ARGV[2])}\n"
  "end\n"
  "if v then return {-1, redis.call('PTTL', KEYS[1])} end\n"
  "return {0, 0}\n",
  /* RL_OP_PTTL: ARGV[1] token */
  "local v = redis.call('GET', KEYS[1])\n"
  "if v == ARGV[1] then\n"
  "  return {1, redis.call('PTTL', KEYS[1])}\n"
  "end\n"
  "if v then return {-1, redis.call('PTTL', KEYS[1])} end\n"
  "return {0, 0}\n",
};

static const char *const op_name[RL_OP_COUNT] = { "acquire", "release", "extend", "pttl" };

static char script_sha[RL_OP_COUNT][41];
static pthread_once_t script_sha_once = PTHREAD_ONCE_INIT;

const char *rl_script_text(rl_op op) { return script_text[op]; }

const char *rl_op_name(rl_op op) { return op_name[op]; }

/* Names every script, once per process (Lua states in several threads may
   load the module at the same time). */
static void compute_script_shas(void) {
  int op;
  for (op = 0; op < RL_OP_COUNT; op++)
    rl_sha1_hex(script_text[op], strlen(script_text[op]), script_sha[op]);
}

const char *rl_script_sha(rl_op op) {
  pthread_once(&script_sha_once, compute_script_shas);
  return script_sha[op];
}

int rl_cmd_init(rl_cmd *cmd, rl_op op, const char *prefix, size_t plen,
                const char *key, size_t klen, const char *token, size_t tlen,
                long long ms) {
  static const char fence_suffix[] = ":fence";
  size_t lock_len = plen + klen + 2, fence_len = lock_len + sizeof fence_suffix - 1;
  char *p;
  memset(cmd, 0, sizeof *cmd);
  cmd->op = op;
  cmd->keys = p = malloc(lock_len + fence_len);
  if (p == NULL) return -1;
  memcpy(p, prefix, plen);
  p[plen] = '{';
  memcpy(p + plen + 1, key, klen);
  p[plen + 1 + klen] = '}';
  memcpy(p + lock_len, p, lock_len);
  memcpy(p + 2 * lock_len, fence_suffix, sizeof fence_suffix - 1);

  cmd->argv[0] = "EVALSHA";
  cmd->argv[1] = rl_script_sha(op);
  cmd->argv[2] = op == RL_OP_ACQUIRE ? "2" : "1";
  cmd->argv[3] = cmd->keys;
  cmd->len[3] = lock_len;
  cmd->argc = 4;
  if (op == RL_OP_ACQUIRE) {
    cmd->argv[4] = cmd->keys + lock_len;
    cmd->len[4] = fence_len;
    cmd->argc = 5;
  }
  cmd->argv[cmd->argc] = token;
  cmd->len[cmd->argc++] = tlen;
  if (op == RL_OP_ACQUIRE || op == RL_OP_EXTEND) {
    cmd->len[cmd->argc] = (size_t)snprintf(cmd->ms, sizeof cmd->ms, "%lld", ms);
    cmd->argv[cmd->argc++] = cmd->ms;
  }
  cmd->len[0] = strlen(cmd->argv[0]);
  cmd->len[1] = strlen(cmd->argv[1]);
  cmd->len[2] = 1;
  return 0;
}

void rl_cmd_use_eval(rl_cmd *cmd) {
  cmd->argv[0] = "EVAL";
  cmd->len[0] = 4;
  cmd->argv[1] = script_text[cmd->op];
  cmd->len[1] = strlen(script_text[cmd->op]);
}

void rl_cmd_free(rl_cmd *cmd) {
  free(cmd->keys);
  cmd->keys = NULL;
}

/* Copies what (len bytes) into err as a C string; returns RL_ERROR. */
static rl_decoded fail(char *err, size_t errlen, const char *what, size_t len) {
  if (errlen > 0) snprintf(err, errlen, "%.*s", (int)len, what);
  return RL_ERROR;
}

rl_decoded rl_decode(const redisReply *r, rl_result *out, char *err, size_t errlen) {
  static const char bad[] = "unexpected reply to a redislock script";
  if (r->type == REDIS_REPLY_ERROR) {
    if (r->len >= 8 && memcmp(r->str, "NOSCRIPT", 8) == 0) return RL_NOSCRIPT;
    return fail(err, errlen, r->str, r->len);
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

const char *rl_check_key(const char *key, size_t len) {
  (void)key;
  if (len == 0) return "key must not be empty";
  /* "<prefix>{}..." would make an empty hash tag: Redis Cluster would then hash
     the whole names and put the lock and its fence counter on different slots. */
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
  if (scaled > (double)RL_MAX_MS) return "must be at most 100 years";
  if (scaled < 1.0) return "must be at least 0.001 (1 ms)";
  *ms = (long long)scaled;
  return NULL;
}

/* Fills buf with OS randomness: getrandom(2) where it exists, else /dev/urandom. */
static int os_random(unsigned char *buf, size_t n) {
  size_t got = 0;
#ifdef __linux__
  while (got < n) {
    ssize_t r = getrandom(buf + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == ENOSYS) break;
      return -1;
    }
    got += (size_t)r;
  }
  if (got == n) return 0;
#endif
  {
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    while (got < n) {
      ssize_t r = read(fd, buf + got, n - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) { close(fd); if (r == 0) errno = EIO; return -1; }
      got += (size_t)r;
    }
    close(fd);
  }
  return 0;
}

int rl_token(char out[RL_TOKEN_HEX + 1]) {
  static const char digits[] = "0123456789abcdef";
  unsigned char raw[RL_TOKEN_BYTES];
  int i;
  if (os_random(raw, sizeof raw) != 0) return -1;
  for (i = 0; i < RL_TOKEN_BYTES; i++) {
    out[2 * i] = digits[raw[i] >> 4];
    out[2 * i + 1] = digits[raw[i] & 15];
  }
  out[RL_TOKEN_HEX] = '\0';
  return 0;
}
