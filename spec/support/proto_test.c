/* SPDX-License-Identifier: MIT */
/*
 * A unit test of the C core's protocol side, alone: rl_proto, rl_call,
 * rl_renewal, rl_script, rl_slot and rl_sys include no Lua header and do no I/O, so they are
 * linked here without Lua and without a server (built by make test as
 * build/proto_test, under the sanitizers; spec/01 runs it). Prints a line per
 * failed check and "proto_test: N checks, N failed"; exit status 0 when
 * none failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rl_call.h"
#include "rl_proto.h"
#include "rl_renewal.h"
#include "rl_sha1.h"

static int checks, failed;

#define CHECK(cond) check((cond) != 0, #cond, __LINE__)

static void check(int ok, const char *what, int line) {
  checks++;
  if (!ok) {
    failed++;
    printf("proto_test: line %d: %s\n", line, what);
  }
}

/* Whether argument i of cmd is the C string s. */
static int arg_is(const rl_cmd *cmd, int i, const char *s) {
  return i < cmd->argc && cmd->len[i] == strlen(s) && memcmp(cmd->argv[i], s, cmd->len[i]) == 0;
}

/* The ops: a name each, a script each, whose SHA-1 is the script's, and
   the commands made of them. */
static void test_ops(void) {
  int op, other;
  for (op = 0; op < RL_OP_COUNT; op++) {
    const char *text = rl_script_text((rl_op)op);
    char sha[41];
    CHECK(rl_op_name((rl_op)op) != NULL && rl_op_name((rl_op)op)[0] != '\0');
    for (other = 0; other < op; other++) CHECK(strcmp(rl_op_name((rl_op)op), rl_op_name((rl_op)other)) != 0);
    CHECK(text != NULL);
    if (text == NULL) continue;
    rl_sha1_hex(text, strlen(text), sha);
    CHECK(strcmp(sha, rl_script_sha((rl_op)op)) == 0);
  }
  CHECK(rl_op_takes_ms(RL_OP_ACQUIRE) && !rl_op_takes_ms(RL_OP_RELEASE) && rl_op_takes_ms(RL_OP_FENCE_UP));
  CHECK(rl_op_takes_n(RL_OP_SEM_ACQUIRE) && !rl_op_takes_n(RL_OP_ACQUIRE));
  CHECK(!rl_op_resendable(RL_OP_RELEASE) && !rl_op_resendable(RL_OP_SEM_RELEASE) && rl_op_resendable(RL_OP_EXTEND));
}

static void test_commands(void) {
  rl_cmd cmd;
  char buf[512], *out = NULL, era[64];
  long long n;
  const char *tag = rl_era_tag(rl_lock_slot("job", 3));
  snprintf(era, sizeof era, "lock:{%s}:fences", tag);

  CHECK(rl_cmd_init(&cmd, RL_OP_ACQUIRE, "lock:", 5, "job", 3, "tok", 3, 1500, 0) == 0);
  CHECK(cmd.argc == 9 && arg_is(&cmd, 0, "EVALSHA") && arg_is(&cmd, 1, rl_script_sha(RL_OP_ACQUIRE)));
  CHECK(arg_is(&cmd, 2, "4") && arg_is(&cmd, 3, "lock:{job}") && arg_is(&cmd, 4, "lock:{job}:fence"));
  CHECK(arg_is(&cmd, 5, "lock:{job}:waiters") && arg_is(&cmd, 6, era));
  CHECK(arg_is(&cmd, 7, "tok") && arg_is(&cmd, 8, "1500"));
  n = rl_cmd_bytes(&cmd, buf, sizeof buf, &out);
  CHECK(n > 0 && out == buf && memcmp(buf, "*9\r\n$7\r\nEVALSHA\r\n$40\r\n", 22) == 0);
  rl_cmd_use_eval(&cmd);
  CHECK(arg_is(&cmd, 0, "EVAL") && arg_is(&cmd, 1, rl_script_text(RL_OP_ACQUIRE)));
  rl_cmd_free(&cmd);

  /* A release: its keys, the holder's fence and the slot's record among
     them, and the token; sent first with its first four keys only, then,
     asked for them (RL_ALL_KEYS), with all eight. */
  CHECK(rl_cmd_init(&cmd, RL_OP_RELEASE, "lock:", 5, "job", 3, "tok", 3, 0, 0) == 0);
  CHECK(cmd.argc == 12 && arg_is(&cmd, 5, "lock:{job}:fence") && arg_is(&cmd, 11, "tok"));
  CHECK(arg_is(&cmd, 2, "4") && cmd.made == 0xf); /* the names it sends only */
  n = rl_cmd_bytes(&cmd, buf, sizeof buf, &out);
  CHECK(n > 0 && out == buf && memcmp(buf, "*8\r\n$7\r\nEVALSHA\r\n$40\r\n", 22) == 0);
  buf[n > 0 ? n : 0] = '\0';
  CHECK(n > 0 && strstr(buf, "$1\r\n4\r\n$10\r\nlock:{job}\r\n$18\r\nlock:{job}:waiters\r\n") != NULL);
  CHECK(memcmp(buf + n - 29, "lock:{job}:handoff\r\n$3\r\ntok\r\n", 29) == 0 && strstr(buf, ":signal") == NULL);
  CHECK(rl_cmd_use_all_keys(&cmd) && arg_is(&cmd, 2, "8") && !rl_cmd_use_all_keys(&cmd));
  CHECK(cmd.made == 0xff && arg_is(&cmd, 6, "lock:{job}:handoff") && arg_is(&cmd, 7, "lock:{job}:signal"));
  CHECK(arg_is(&cmd, 10, era) && arg_is(&cmd, 11, "tok"));
  n = rl_cmd_bytes(&cmd, buf, sizeof buf, &out);
  CHECK(n > 0 && out == buf && memcmp(buf, "*12\r\n$7\r\nEVALSHA\r\n", 18) == 0);
  rl_cmd_free(&cmd);

  /* A take makes the lock's name and its fence record's, what it sends;
     the acquire it falls back on, all four. */
  CHECK(rl_cmd_init(&cmd, RL_OP_TAKE, "lock:", 5, "job", 3, "tok", 3, 1500, 0) == 0);
  CHECK(cmd.argc == 9 && cmd.made == 0x9 && arg_is(&cmd, 3, "lock:{job}") && arg_is(&cmd, 6, era));
  rl_cmd_use_acquire(&cmd);
  CHECK(cmd.op == RL_OP_ACQUIRE && cmd.made == 0xf && arg_is(&cmd, 4, "lock:{job}:fence"));
  CHECK(arg_is(&cmd, 5, "lock:{job}:waiters") && arg_is(&cmd, 6, era) && arg_is(&cmd, 7, "tok"));
  rl_cmd_free(&cmd);

  /* Keys that do not fit the command's own buffer. */
  {
    static char key[2000];
    memset(key, 'k', sizeof key - 1);
    CHECK(rl_cmd_init(&cmd, RL_OP_RELEASE, "lock:", 5, key, sizeof key - 1, "tok", 3, 0, 0) == 0);
    CHECK(cmd.argc == 12 && cmd.len[3] == 5 + 2 + sizeof key - 1 && cmd.keys != cmd.inline_keys);
    n = rl_cmd_bytes(&cmd, buf, sizeof buf, &out);
    CHECK(n > (long long)sizeof buf && out != buf);
    if (out != buf) free(out);
    rl_cmd_free(&cmd);
  }

  /* Waits: the shared list, a fair waiter's own, a semaphore's. */
  CHECK(rl_wait_init(&cmd, RL_OP_ACQUIRE, "lock:", 5, "job", 3, NULL, 0, 1500) == 0);
  CHECK(cmd.argc == 3 && arg_is(&cmd, 0, "BLPOP") && arg_is(&cmd, 1, "lock:{job}:signal") && arg_is(&cmd, 2, "1.500"));
  rl_cmd_free(&cmd);
  CHECK(rl_wait_init(&cmd, RL_OP_ACQUIRE_FAIR, "lock:", 5, "job", 3, "tok", 3, 20) == 0);
  CHECK(arg_is(&cmd, 1, "lock:{job}:signal:tok") && arg_is(&cmd, 2, "0.020"));
  rl_cmd_free(&cmd);
  CHECK(rl_wait_init(&cmd, RL_OP_SEM_ACQUIRE, "p:", 2, "pool", 4, NULL, 0, 0) == 0);
  CHECK(arg_is(&cmd, 1, "p:{pool}:permits:signal") && arg_is(&cmd, 2, "0.001")); /* never BLPOP 0 */
  rl_cmd_free(&cmd);
}

static void test_replies(void) {
  rl_result r;
  CHECK(rl_decode_bytes(":42\r\n", 5, 0, &r) == 1 && r.status == RL_HELD && r.value == 42);
  CHECK(rl_decode_bytes(":0\r\n", 4, 0, &r) == 1 && r.status == RL_FREE);
  CHECK(rl_decode_bytes(":-1502\r\n", 8, 0, &r) == 1 && r.status == RL_OTHER && r.value == 1500);
  CHECK(rl_decode_bytes("*2\r\n:-1\r\n:250\r\n", 15, 0, &r) == 1 && r.status == RL_OTHER && r.value == 250);
  CHECK(rl_decode_bytes(":42\r", 4, 0, &r) == 0);            /* not whole: for a reader */
  CHECK(rl_decode_bytes("-NOSCRIPT x\r\n", 13, 0, &r) == 0);  /* errors too */
  CHECK(rl_decode_bytes("*2\r\n:2\r\n:7\r\n", 13, 0, &r) == 0);  /* a script never answers 2 */
}

/* A take's replies: MULTI's, two QUEUED, then EXEC's array (SET's, the
   fence record's new ID). */
static void test_takes(void) {
  static const char head[] = "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n";
  char buf[256];
  rl_result r;
  int n;
  /* Taken: the fence is (ms - RL_FENCE_EPOCH_MS) * RL_FENCE_SCALE + seq. */
  n = snprintf(buf, sizeof buf, "%s+OK\r\n$15\r\n1795815729123-7\r\n", head);
  CHECK(rl_decode_bytes(buf, (size_t)n, 1, &r) == 1 && r.status == RL_HELD);
  CHECK(r.value == (1795815729123LL - RL_FENCE_EPOCH_MS) * RL_FENCE_SCALE + 7);
  /* Taken, but RL_FENCE_SCALE IDs in one ms: the script tells the fence. */
  n = snprintf(buf, sizeof buf, "%s+OK\r\n$16\r\n1795815729123-64\r\n", head);
  CHECK(rl_decode_bytes(buf, (size_t)n, 1, &r) == 1 && r.status == RL_UNTOLD);
  n = snprintf(buf, sizeof buf, "%s+OK\r\n$16\r\n1795815729123-63\r\n", head);
  CHECK(rl_decode_bytes(buf, (size_t)n, 1, &r) == 1 && r.status == RL_HELD);
  CHECK(r.value == (1795815729123LL - RL_FENCE_EPOCH_MS) * RL_FENCE_SCALE + 63);
  /* A clock before the epoch tells none either (the script says why). */
  n = snprintf(buf, sizeof buf, "%s+OK\r\n$10\r\n86400000-1\r\n", head);
  CHECK(rl_decode_bytes(buf, (size_t)n, 1, &r) == 1 && r.status == RL_UNTOLD);
  /* Held by another: its TTL unknown (the acquire script tells it). */
  n = snprintf(buf, sizeof buf, "%s$-1\r\n$15\r\n1795815729123-8\r\n", head);
  CHECK(rl_decode_bytes(buf, (size_t)n, 1, &r) == 1 && r.status == RL_OTHER && r.value == RL_PTTL_UNKNOWN);
  /* Not an ID: no fence. Cut short, or an error inside EXEC: for a reader. */
  n = snprintf(buf, sizeof buf, "%s+OK\r\n$5\r\nbogus\r\n", head);
  CHECK(rl_decode_bytes(buf, (size_t)n, 1, &r) == 1 && r.status == RL_UNTOLD);
  n = snprintf(buf, sizeof buf, "%s+OK\r\n$15\r\n1795815729123-7\r\n", head);
  CHECK(rl_decode_bytes(buf, (size_t)n - 3, 1, &r) == 0);
  n = snprintf(buf, sizeof buf, "%s+OK\r\n-WRONGTYPE Operation against a key\r\n", head);
  CHECK(rl_decode_bytes(buf, (size_t)n, 1, &r) == 0);
}

static void test_slots(void) {
  rl_redirect rd;
  int slot, bad = 0;
  CHECK(rl_slot("123456789", 9) == 12739); /* the cluster specification's example */
  CHECK(rl_slot("{user1000}.following", 20) == rl_slot("user1000", 8));
  CHECK(rl_slot("foo{}{bar}", 10) != rl_slot("bar", 3)); /* an empty tag: the whole name */
  CHECK(rl_lock_slot("job", 3) == rl_slot("lock:{job}:fence", 16));
  for (slot = 0; slot < RL_SLOTS; slot++) {
    const char *tag = rl_era_tag(slot);
    if (strlen(tag) < 1 || strlen(tag) > 4 || rl_slot(tag, strlen(tag)) != slot) bad++;
  }
  CHECK(bad == 0);
  CHECK(rl_parse_redirect("MOVED 3999 127.0.0.1:6381", 25, &rd) == RL_MOVED && rd.slot == 3999 && rd.port == 6381 &&
        rd.hlen == 9 && memcmp(rd.host, "127.0.0.1", 9) == 0);
  CHECK(rl_parse_redirect("ASK 12 ::1:7000", 15, &rd) == RL_ASK && rd.port == 7000 && rd.hlen == 3);
  CHECK(rl_parse_redirect("MOVED 12 :7000", 14, &rd) == RL_MOVED && rd.hlen == 0);
  CHECK(rl_parse_redirect("MOVED 16384 h:1", 15, &rd) == RL_NO_REDIRECT);
  CHECK(rl_parse_redirect("ERR unknown", 11, &rd) == RL_NO_REDIRECT);
}

static void test_checks(void) {
  long long ms = 0;
  char a[RL_TOKEN_HEX + 1], b[RL_TOKEN_HEX + 1];
  size_t i;
  CHECK(rl_check_key("", 0) != NULL && rl_check_key("}x", 2) != NULL && rl_check_key("x}", 2) == NULL);
  CHECK(rl_check_prefix("a{", 2) != NULL && rl_check_prefix("a:", 2) == NULL);
  CHECK(rl_seconds_to_ms(1.5, &ms) == NULL && ms == 1500);
  CHECK(rl_seconds_to_ms(0.0015, &ms) == NULL && ms == 2);
  CHECK(rl_seconds_to_ms(0, &ms) != NULL && rl_seconds_to_ms(-1, &ms) != NULL && rl_seconds_to_ms(0.0001, &ms) != NULL);
  CHECK(rl_seconds_to_ms(0.0 / 0.0, &ms) != NULL && rl_seconds_to_ms(1e300 * 1e300, &ms) != NULL);
  CHECK(rl_token(a) == 0 && rl_token(b) == 0 && strlen(a) == RL_TOKEN_HEX && strcmp(a, b) != 0);
  for (i = 0; i < RL_TOKEN_HEX; i++) CHECK(strchr("0123456789abcdef", a[i]) != NULL);
  ms = rl_now_ms();
  CHECK(ms > 0 && ms <= rl_now_ms());
}

/* The class of the C string msg. */
static rl_error_class class_of(const char *msg) {
  return rl_error_class_of(msg, strlen(msg));
}

/* Error messages classified once: the server's codes, the transports' own
   failures (as both word them), a script's line, the code words. */
static void test_errors(void) {
  static const char *const names[] = { "transient", "stale",   "demoted", "tryagain", "clusterdown", "redirect",
                                       "refused",   "script",  "redis",   "connect",  "unsent",      "timeout",
                                       "closed",    "connection" };
  char msg[RL_ERRLEN];
  rl_error_class c;
  size_t i;
  CHECK(class_of("redis: LOADING Redis is loading the dataset in memory") == RL_EC_TRANSIENT);
  CHECK(class_of("redis: BUSY Redis is busy running a script.") == RL_EC_TRANSIENT);
  CHECK(class_of("redis: BUSYGROUP Consumer Group name already exists") == RL_EC_REDIS); /* the whole code */
  CHECK(class_of("redis: READONLY You can't write against a read only replica.") == RL_EC_STALE);
  CHECK(class_of("redis: MASTERDOWN Link with MASTER is down") == RL_EC_STALE);
  CHECK(class_of("redis: UNBLOCKED force unblock from blocking operation") == RL_EC_STALE);
  CHECK(class_of("redis: TRYAGAIN Multiple keys request during rehashing of slot") == RL_EC_TRYAGAIN);
  CHECK(class_of("redis: CLUSTERDOWN Hash slot 12 is not served") == RL_EC_CLUSTERDOWN);
  CHECK(class_of("redis: MOVED 3999 127.0.0.1:6381") == RL_EC_REDIRECT && class_of("redis: ASK 1 :7000") == RL_EC_REDIRECT);
  CHECK(class_of("redis: NOPERM this user has no permissions to run the 'evalsha' command") == RL_EC_REFUSED);
  CHECK(class_of("redis: NOSCRIPT after EVAL") == RL_EC_REFUSED && class_of("redis: OOM command not allowed") == RL_EC_REFUSED);
  /* A command within a script refused: it ran up to its line; a state refuses every write all the same. */
  CHECK(class_of("redis: NOPERM User may not run 'del'. script: 1f2e, on @user_script:12.") == RL_EC_SCRIPT);
  CHECK(class_of("redis: ERR Error running script, on @user_script:3.") == RL_EC_SCRIPT);
  CHECK(class_of("redis: no sentinel knows master \"mymaster\" (127.0.0.1:26379 does not know it)") == RL_EC_UNNAMED);
  CHECK(strcmp(rl_error_class_name(RL_EC_UNNAMED), "unnamed") == 0);
  CHECK(class_of("redis: READONLY You can't write. script: 1f2e, on @user_script:7.") == RL_EC_STALE);
  CHECK(class_of("redis: ERR unknown command 'EVALSHA'") == RL_EC_REDIS && class_of("redis: WRONGPASS invalid") == RL_EC_REDIS);
  CHECK(class_of("redis: AUTH refused by 127.0.0.1:6379: LOADING ...") == RL_EC_REDIS); /* our sentence's code */
  CHECK(class_of("redis: Redlock cannot run x") == RL_EC_REDIS && class_of("redis:") == RL_EC_REDIS);
  CHECK(class_of("redis: READONLY 127.0.0.1:7000 says ROLE slave on a new connection, not master (nothing was sent)")
        == RL_EC_DEMOTED);
  /* The transports' own: nothing sent, sent but not answered, the rest. */
  CHECK(class_of("connection: cannot connect to 127.0.0.1:1 (Connection refused)") == RL_EC_CONNECT);
  CHECK(class_of("connection: cannot connect to h:1 (TLS: the server's certificate is not trusted)") == RL_EC_CONNECT);
  rl_io_message(RL_IO_TIMEOUT, "127.0.0.1:6379", NULL, 1500, msg, sizeof msg);
  CHECK(class_of(msg) == RL_EC_TIMEOUT);
  rl_io_message(RL_IO_CLOSED, "127.0.0.1:6379", NULL, 0, msg, sizeof msg);
  CHECK(class_of(msg) == RL_EC_CLOSED);
  rl_io_message(RL_IO_LOST, "127.0.0.1:6379", "Connection reset by peer", 0, msg, sizeof msg);
  CHECK(class_of(msg) == RL_EC_CLOSED);
  CHECK(class_of("connection: h:1 closed the connection before any answer (a TLS port? use rediss://)") == RL_EC_CLOSED);
  CHECK(class_of("connection: 127.0.0.1:7000 closed the connection (nothing was sent)") == RL_EC_UNSENT);
  rl_read_error(REDIS_ERR_PROTOCOL, "Protocol error, got \"x\" as reply type byte", "h:1", msg, sizeof msg);
  CHECK(class_of(msg) == RL_EC_CONNECTION);
  rl_read_error(REDIS_ERR_PROTOCOL, "No support for nested multi bulk replies with depth > 7", "h:1", msg, sizeof msg);
  CHECK(class_of(msg) == RL_EC_REDIS);
  CHECK(class_of("connection: out of memory") == RL_EC_CONNECTION);
  /* The code words of the library's answers; anything else has no class. */
  CHECK(class_of("busy: \"job\" is held by another owner") == RL_EC_BUSY && class_of("lost: \"job\" expired") == RL_EC_LOST);
  CHECK(class_of("") == RL_EC_NONE && class_of("renewal: out of memory") == RL_EC_NONE && class_of("redi") == RL_EC_NONE);
  /* Every class has a name, and the codes' table names the classes. */
  CHECK(rl_error_class_name(RL_EC_NONE) == NULL);
  for (i = 0; i < sizeof names / sizeof names[0]; i++)
    CHECK(strcmp(rl_error_class_name((rl_error_class)(RL_EC_TRANSIENT + i)), names[i]) == 0);
  for (i = 0; rl_error_code(i, &c) != NULL; i++) {
    snprintf(msg, sizeof msg, "redis: %s x", rl_error_code(i, &c));
    CHECK(class_of(msg) == c);
  }
  CHECK(i == 12);
}

/* Whether the bytes the call sends now contain s. */
static int sends(const rl_call *call, const char *s) {
  size_t len;
  const char *b = rl_call_bytes(call, &len);
  size_t n = strlen(s);
  for (size_t i = 0; i + n <= len; i++)
    if (memcmp(b + i, s, n) == 0) return 1;
  return 0;
}

/* Feeds the C string s to the call. */
static rl_step feed(rl_call *call, const char *s) {
  return rl_call_feed(call, s, strlen(s));
}

/* A call made for op, started on a connection (reused or not) with
   reader rd. */
static rl_step start(rl_call *call, rl_cmd *cmd, rl_op op, int reused, redisReader *rd) {
  CHECK(rl_cmd_init(cmd, op, "lock:", 5, "job", 3, "tok", 3, 5000, 0) == 0);
  rl_call_init(call, cmd);
  return rl_call_start(call, reused, rd);
}

/* The call state machine, fed canned replies (no server, no I/O). */
static void test_call(void) {
  static const char took[] = "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n$15\r\n1795815729123-3\r\n";
  static const char busy[] = "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n$-1\r\n$15\r\n1795815729123-4\r\n";
  static const char untold[] = "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n$16\r\n1795815729123-64\r\n";
  redisReader *rd = redisReaderCreate();
  rl_cmd cmd;
  rl_call call;

  /* The acquire script; its reply is the result. */
  CHECK(start(&call, &cmd, RL_OP_ACQUIRE, 0, rd) == RL_STEP_SEND && sends(&call, "EVALSHA") && !sends(&call, "MULTI"));
  CHECK(feed(&call, ":28723456789012345\r\n") == RL_STEP_DONE);
  CHECK(call.out.status == RL_HELD && call.out.value == 28723456789012345LL && rl_call_keep(&call));
  rl_call_free(&call);
  rl_cmd_free(&cmd);

  /* A cluster's redirect is the call's to follow: where to, read once here. */
  CHECK(start(&call, &cmd, RL_OP_EXTEND, 0, rd) == RL_STEP_SEND && call.redirect.kind == RL_NO_REDIRECT);
  CHECK(feed(&call, "-MOVED 3999 127.0.0.1:7002\r\n") == RL_STEP_FAILED);
  CHECK(call.redirect.kind == RL_MOVED && call.redirect.slot == 3999 && call.redirect.port == 7002);
  CHECK(strcmp(call.redirect.host, "127.0.0.1") == 0 && strcmp(call.err, "redis: MOVED 3999 127.0.0.1:7002") == 0);
  rl_call_free(&call);
  rl_cmd_free(&cmd);
  CHECK(start(&call, &cmd, RL_OP_EXTEND, 0, rd) == RL_STEP_SEND);
  CHECK(feed(&call, "-ASK 12 :7000\r\n") == RL_STEP_FAILED);
  CHECK(call.redirect.kind == RL_ASK && call.redirect.port == 7000 && call.redirect.host[0] == '\0');
  rl_call_free(&call);
  rl_cmd_free(&cmd);
  CHECK(start(&call, &cmd, RL_OP_EXTEND, 0, rd) == RL_STEP_SEND);
  CHECK(feed(&call, "-READONLY You can't write against a read only replica.\r\n") == RL_STEP_FAILED);
  CHECK(call.redirect.kind == RL_NO_REDIRECT && rl_error_class_of(call.err, strlen(call.err)) == RL_EC_STALE);
  rl_call_free(&call);
  rl_cmd_free(&cmd);

  /* A take: MULTI, SET NX PX, XADD of the slot's fence record, EXEC. Taken:
     the record's new ID is the fence, with no script. */
  CHECK(start(&call, &cmd, RL_OP_TAKE, 0, rd) == RL_STEP_SEND && sends(&call, "MULTI") && sends(&call, "XADD"));
  CHECK(sends(&call, "$4\r\nXADD\r\n$") && sends(&call, ":fences\r\n$6\r\nMAXLEN\r\n$1\r\n0\r\n$1\r\n*"));
  CHECK(feed(&call, took) == RL_STEP_DONE && call.out.status == RL_HELD);
  CHECK(call.out.value == (1795815729123LL - RL_FENCE_EPOCH_MS) * RL_FENCE_SCALE + 3 && rl_call_keep(&call));
  rl_call_free(&call);
  rl_cmd_free(&cmd);

  /* A take that found the lock held: the acquire script follows on the
     same connection; its reply is the result. */
  CHECK(start(&call, &cmd, RL_OP_TAKE, 0, rd) == RL_STEP_SEND);
  CHECK(rl_call_feed(&call, busy, 10) == RL_STEP_READ); /* in pieces */
  CHECK(feed(&call, busy + 10) == RL_STEP_SEND && sends(&call, "EVALSHA") && !sends(&call, "MULTI"));
  CHECK(feed(&call, "*2\r\n:-1\r\n:4200\r\n") == RL_STEP_DONE);
  CHECK(call.out.status == RL_OTHER && call.out.value == 4200 && rl_call_keep(&call));
  rl_call_free(&call);
  rl_cmd_free(&cmd);

  /* Taken, the ID telling no fence (16 in one ms): the script tells it. */
  CHECK(start(&call, &cmd, RL_OP_TAKE, 0, rd) == RL_STEP_SEND);
  CHECK(feed(&call, untold) == RL_STEP_SEND && sends(&call, "EVALSHA"));
  CHECK(feed(&call, ":28733051674977\r\n") == RL_STEP_DONE && call.out.status == RL_HELD);
  CHECK(call.out.value == 28733051674977LL);
  rl_call_free(&call);
  rl_cmd_free(&cmd);

  /* The script after a take that took the lock, refused: the take's lock
     is given back (WATCH and GET it on the same connection, then MULTI,
     DEL, EXEC while it holds the take's token); the call fails all the
     same, saying nothing is left. */
  CHECK(start(&call, &cmd, RL_OP_TAKE, 0, rd) == RL_STEP_SEND);
  CHECK(feed(&call, untold) == RL_STEP_SEND);
  CHECK(feed(&call, "-NOPERM no evalsha\r\n") == RL_STEP_SEND
        && sends(&call, "$5\r\nWATCH\r\n$10\r\nlock:{job}\r\n") && sends(&call, "$3\r\nGET\r\n$10\r\nlock:{job}\r\n"));
  CHECK(feed(&call, "+OK\r\n$3\r\ntok\r\n") == RL_STEP_SEND && sends(&call, "MULTI")
        && sends(&call, "$3\r\nDEL\r\n$10\r\nlock:{job}\r\n") && sends(&call, "EXEC"));
  CHECK(feed(&call, "+OK\r\n+QUEUED\r\n*1\r\n:1\r\n") == RL_STEP_FAILED && rl_call_keep(&call)); /* EXEC ended the WATCH */
  CHECK(strcmp(call.err, "redis: NOPERM no evalsha; nothing its first try took is left") == 0);
  CHECK(call.left == RL_LEFT_NOTHING && strcmp(rl_left_name(call.left), "nothing") == 0);
  rl_call_free(&call);
  rl_cmd_free(&cmd);

  /* ... and when WATCH is refused, it stays (said beside the message,
     for the caller's release script, which says in words what it left); a
     refused script after a take that took nothing says nothing of it. */
  CHECK(start(&call, &cmd, RL_OP_TAKE, 0, rd) == RL_STEP_SEND);
  CHECK(feed(&call, untold) == RL_STEP_SEND);
  CHECK(feed(&call, "-ERR script refused PEXPIRE\r\n") == RL_STEP_SEND && sends(&call, "WATCH"));
  CHECK(feed(&call, "-NOPERM no watch\r\n$3\r\ntok\r\n") == RL_STEP_FAILED && !rl_call_keep(&call));
  CHECK(strncmp(call.err, "redis: ERR script refused PEXPIRE", 33) == 0);
  CHECK(strstr(call.err, "first try") == NULL); /* the caller's release says what stays */
  CHECK(call.left == RL_LEFT_STAYING && strcmp(rl_left_name(call.left), "staying") == 0);
  rl_call_free(&call);
  rl_cmd_free(&cmd);
  /* ... and when the connection is lost while it gives the lock back. */
  CHECK(start(&call, &cmd, RL_OP_TAKE, 0, rd) == RL_STEP_SEND);
  CHECK(feed(&call, untold) == RL_STEP_SEND);
  CHECK(feed(&call, "-NOPERM no evalsha\r\n") == RL_STEP_SEND && sends(&call, "WATCH"));
  CHECK(rl_call_lost(&call, 0, "connection: lost") == RL_STEP_FAILED && call.left == RL_LEFT_STAYING);
  CHECK(strcmp(call.err, "redis: NOPERM no evalsha") == 0);
  rl_call_free(&call);
  rl_cmd_free(&cmd);
  CHECK(start(&call, &cmd, RL_OP_TAKE, 0, rd) == RL_STEP_SEND);
  CHECK(feed(&call, busy) == RL_STEP_SEND && sends(&call, "EVALSHA"));
  CHECK(feed(&call, "-NOPERM no evalsha\r\n") == RL_STEP_FAILED && strcmp(call.err, "redis: NOPERM no evalsha") == 0);
  CHECK(call.left == RL_LEFT_UNSAID && rl_left_name(call.left) == NULL);
  rl_call_free(&call);
  rl_cmd_free(&cmd);

  /* A take lost: the acquire script reconciles on another connection. */
  CHECK(start(&call, &cmd, RL_OP_TAKE, 1, rd) == RL_STEP_SEND);
  CHECK(rl_call_lost(&call, 0, "connection: lost") == RL_STEP_RECONNECT);
  CHECK(rl_call_start(&call, 0, rd) == RL_STEP_SEND && sends(&call, "EVALSHA") && !sends(&call, "MULTI"));
  rl_call_free(&call);
  rl_cmd_free(&cmd);

  /* A reply split where a read may split it: the reader assembles it (the
     shortcut without a reader takes only a whole first read). */
  CHECK(start(&call, &cmd, RL_OP_ACQUIRE, 0, rd) == RL_STEP_SEND);
  CHECK(feed(&call, "*2\r\n:-1\r\n") == RL_STEP_READ);
  CHECK(feed(&call, ":4200\r\n") == RL_STEP_DONE && call.out.status == RL_OTHER && call.out.value == 4200);
  CHECK(rl_call_keep(&call) && rd->pos == rd->len);
  rl_call_free(&call);
  rl_cmd_free(&cmd);

  /* A script refused (no memory, no permission): the call's error, with
     the command named when it is one the library needs. */
  CHECK(start(&call, &cmd, RL_OP_ACQUIRE, 0, rd) == RL_STEP_SEND);
  CHECK(feed(&call, "-OOM command not allowed\r\n") == RL_STEP_FAILED && rl_call_keep(&call));
  CHECK(strcmp(call.err, "redis: OOM command not allowed") == 0);
  rl_call_free(&call);
  rl_cmd_free(&cmd);

  /* NOSCRIPT: EVAL once; a second NOSCRIPT is the call's error. */
  CHECK(start(&call, &cmd, RL_OP_EXTEND, 1, rd) == RL_STEP_SEND && sends(&call, "EVALSHA"));
  CHECK(feed(&call, "-NOSCRIPT No matching script.\r\n") == RL_STEP_SEND && sends(&call, "$4\r\nEVAL\r\n"));
  CHECK(feed(&call, "-NOSCRIPT No matching script.\r\n") == RL_STEP_FAILED);
  CHECK(strcmp(call.err, "redis: NOSCRIPT after EVAL") == 0 && rl_call_keep(&call));
  rl_call_free(&call);
  rl_cmd_free(&cmd);

  /* The one resend: a reused connection lost, not timed out, and not a release. */
  CHECK(start(&call, &cmd, RL_OP_EXTEND, 1, rd) == RL_STEP_SEND);
  CHECK(rl_call_lost(&call, 0, "connection: lost") == RL_STEP_RECONNECT && !rl_call_keep(&call));
  CHECK(rl_call_start(&call, 1, rd) == RL_STEP_SEND);
  CHECK(rl_call_lost(&call, 0, "connection: lost again") == RL_STEP_FAILED);
  CHECK(strcmp(call.err, "connection: lost again") == 0);
  rl_call_free(&call);
  rl_cmd_free(&cmd);
  CHECK(start(&call, &cmd, RL_OP_RELEASE, 1, rd) == RL_STEP_SEND);
  CHECK(rl_call_lost(&call, 0, "connection: lost") == RL_STEP_FAILED);
  rl_call_free(&call);
  rl_cmd_free(&cmd);

  /* A release that finds somebody waiting asks for all its keys: sent
     again with them, its second answer is the call's; the name's next
     release sends them all at once, until one finds nobody waiting
     (RL_NO_WAITERS, 1 to the caller). */
  CHECK(start(&call, &cmd, RL_OP_RELEASE, 1, rd) == RL_STEP_SEND && sends(&call, "*8\r\n"));
  CHECK(feed(&call, ":2\r\n") == RL_STEP_SEND && sends(&call, "*12\r\n") && sends(&call, ":signal"));
  CHECK(feed(&call, ":1\r\n") == RL_STEP_DONE && call.out.status == RL_HELD && call.out.value == 1);
  rl_call_free(&call);
  rl_cmd_free(&cmd);
  CHECK(start(&call, &cmd, RL_OP_RELEASE, 1, rd) == RL_STEP_SEND && sends(&call, "*12\r\n"));
  CHECK(feed(&call, ":2\r\n") == RL_STEP_DONE); /* with all its keys, an answer as it is */
  rl_call_free(&call);
  rl_cmd_free(&cmd);
  CHECK(start(&call, &cmd, RL_OP_RELEASE, 1, rd) == RL_STEP_SEND && sends(&call, "*12\r\n"));
  CHECK(feed(&call, ":3\r\n") == RL_STEP_DONE && call.out.status == RL_HELD && call.out.value == 1);
  rl_call_free(&call);
  rl_cmd_free(&cmd);
  CHECK(start(&call, &cmd, RL_OP_RELEASE, 1, rd) == RL_STEP_SEND && sends(&call, "*8\r\n"));
  CHECK(feed(&call, ":1\r\n") == RL_STEP_DONE && call.out.value == 1);
  rl_call_free(&call);
  rl_cmd_free(&cmd);
  /* Only a release reads 3 so. */
  CHECK(start(&call, &cmd, RL_OP_EXTEND, 1, rd) == RL_STEP_SEND);
  CHECK(feed(&call, ":3\r\n") == RL_STEP_DONE && call.out.value == 3);
  rl_call_free(&call);
  rl_cmd_free(&cmd);
  CHECK(start(&call, &cmd, RL_OP_ACQUIRE, 1, rd) == RL_STEP_SEND);
  CHECK(rl_call_lost(&call, 1, "connection: timeout") == RL_STEP_FAILED);
  rl_call_free(&call);
  rl_cmd_free(&cmd);
  /* An acquire lost on a reused connection: resent once (the script
     finds its own token if the first landed). */
  CHECK(start(&call, &cmd, RL_OP_ACQUIRE, 1, rd) == RL_STEP_SEND);
  CHECK(rl_call_lost(&call, 0, "connection: lost") == RL_STEP_RECONNECT);
  CHECK(rl_call_start(&call, 0, rd) == RL_STEP_SEND && sends(&call, "EVALSHA"));
  rl_call_free(&call);
  rl_cmd_free(&cmd);

  /* ASKING first, a take as the script; its refusal is the call's error. */
  CHECK(rl_cmd_init(&cmd, RL_OP_TAKE, "lock:", 5, "job", 3, "tok", 3, 5000, 0) == 0);
  rl_call_init(&call, &cmd);
  call.asking = 1;
  CHECK(rl_call_start(&call, 0, rd) == RL_STEP_SEND && sends(&call, "ASKING") && sends(&call, "EVALSHA"));
  CHECK(feed(&call, "-ERR not a cluster\r\n:1\r\n") == RL_STEP_FAILED);
  CHECK(strcmp(call.err, "redis: ASKING: ERR not a cluster") == 0);
  rl_call_free(&call);
  rl_cmd_free(&cmd);

  /* WAIT after a script that answered 1, on the same connection; a WAIT
     lost leaves the lock ours, with why. Bytes past a reply: out of step. */
  CHECK(rl_cmd_init(&cmd, RL_OP_ACQUIRE, "lock:", 5, "job", 3, "tok", 3, 5000, 0) == 0);
  rl_call_init(&call, &cmd);
  call.replicas = 2;
  call.replica_ms = 300;
  CHECK(rl_call_start(&call, 0, rd) == RL_STEP_SEND);
  CHECK(feed(&call, ":3\r\n") == RL_STEP_SEND && sends(&call, "WAIT") && rl_call_read_ms(&call) == 1300);
  CHECK(rl_call_lost(&call, 1, "connection: timeout") == RL_STEP_DONE);
  CHECK(call.out.value == 3 && strcmp(call.wait_err, "connection: timeout") == 0 && call.err[0] == '\0');
  rl_call_free(&call);
  rl_call_init(&call, &cmd);
  call.replicas = 1;
  call.replica_ms = 300;
  CHECK(rl_call_start(&call, 0, rd) == RL_STEP_SEND);
  CHECK(feed(&call, ":3\r\n:1\r\n") == RL_STEP_DONE && !rl_call_keep(&call) && call.wait_err[0] != '\0');
  rl_call_free(&call);
  rl_cmd_free(&cmd);
  redisReaderFree(rd);
}

/* Scripts sent with their callers' arguments: the names the core makes,
   and the call's EVAL after NOSCRIPT, its reply the caller's. */
static void test_args(void) {
  const char *keys[] = { "a", "b" }, *args[] = { "tok", "500" };
  size_t klen[] = { 1, 1 }, alen[] = { 3, 3 };
  rl_args_cmd a;
  rl_call call;
  redisReader *rd = redisReaderCreate();
  CHECK(rl_op_takes_args(RL_OP_INSPECT) && !rl_op_takes_args(RL_OP_ACQUIRE) && rl_args_many(RL_OP_MULTI_ACQUIRE));
  CHECK(rl_args_named(RL_OP_FENCED_WRITE) && rl_args_named(RL_OP_COUNT) && !rl_args_named(RL_OP_INSPECT));
  CHECK(rl_args_init(&a, RL_OP_INSPECT, NULL, 0, NULL, "lock:", 5, 1, keys, klen, 0, NULL, NULL) == 0);
  CHECK(a.argc == 5 && strcmp(a.argv[0], "EVALSHA") == 0 && strcmp(a.argv[1], rl_script_sha(RL_OP_INSPECT)) == 0);
  CHECK(a.len[2] == 1 && memcmp(a.argv[2], "2", 1) == 0 && a.len[3] == 8 && memcmp(a.argv[3], "lock:{a}", 8) == 0);
  CHECK(a.len[4] == 14 && memcmp(a.argv[4], "lock:{a}:fence", 14) == 0);
  rl_args_free(&a);
  /* Several lock keys: every lock, then every fence ... then the arguments. */
  CHECK(rl_args_init(&a, RL_OP_MULTI_ACQUIRE, NULL, 0, NULL, "lock:", 5, 2, keys, klen, 2, args, alen) == 0);
  CHECK(a.argc == 3 + 8 + 2 && a.len[2] == 1 && memcmp(a.argv[2], "8", 1) == 0);
  CHECK(memcmp(a.argv[3], "lock:{a}", 8) == 0 && memcmp(a.argv[4], "lock:{b}", 8) == 0);
  CHECK(a.len[5] == 14 && memcmp(a.argv[5], "lock:{a}:fence", 14) == 0);
  CHECK(a.len[11] == 3 && memcmp(a.argv[11], "tok", 3) == 0 && memcmp(a.argv[12], "500", 3) == 0);
  rl_args_free(&a);
  /* A guard's script: its names as given, its text and SHA-1 the caller's. */
  CHECK(rl_args_init(&a, RL_OP_COUNT, NULL, 0, NULL, "lock:", 5, 2, keys, klen, 1, args, alen) == -1);
  CHECK(rl_args_init(&a, RL_OP_COUNT, "return 1", 8, "0123456789012345678901234567890123456789", "lock:", 5, 2, keys,
                     klen, 1, args, alen) == 0);
  CHECK(a.argc == 6 && memcmp(a.argv[2], "2", 1) == 0 && a.len[3] == 1 && memcmp(a.argv[3], "a", 1) == 0);
  rl_call_init_args(&call, &a);
  CHECK(rl_call_start(&call, 1, rd) == RL_STEP_SEND && sends(&call, "EVALSHA") && sends(&call, "$40\r\n0123"));
  CHECK(feed(&call, "-NOSCRIPT No matching script.\r\n") == RL_STEP_SEND && sends(&call, "$4\r\nEVAL\r\n$8\r\nreturn 1"));
  CHECK(feed(&call, "*2\r\n:1\r\n$2\r\nok\r\n") == RL_STEP_DONE && call.reply != NULL);
  CHECK(call.reply->type == REDIS_REPLY_ARRAY && call.reply->elements == 2 && rl_call_keep(&call));
  rl_call_free(&call);
  /* Its error replies are the caller's too; it is never resent. */
  rl_call_init_args(&call, &a);
  CHECK(rl_call_start(&call, 1, rd) == RL_STEP_SEND && sends(&call, "$4\r\nEVAL\r\n"));
  CHECK(feed(&call, "-ERR boom\r\n") == RL_STEP_DONE && call.reply != NULL && call.reply->type == REDIS_REPLY_ERROR);
  rl_call_free(&call);
  rl_call_init_args(&call, &a);
  CHECK(rl_call_start(&call, 1, rd) == RL_STEP_SEND);
  CHECK(rl_call_lost(&call, 0, "connection: lost") == RL_STEP_FAILED);
  rl_call_free(&call);
  rl_args_free(&a);
  redisReaderFree(rd);
}

/* One node's lease (rl_renewal), driven by hand: times are made-up ms. */
static void test_renewal(void) {
  rl_renewal r;
  /* Acquired at 100 (sent), TTL 3000: renewed every 1000 from the acquire. */
  rl_renewal_init(&r, "the watchdog", 3000, 0, 100, 105);
  CHECK(r.state == RL_LEASE_HELD && r.due == 1100 && rl_renewal_expires(&r) == 3100);
  CHECK(rl_renewal_next(&r, 500) == RL_RENEW_LATER && !rl_renewal_due_now(&r, 500));
  CHECK(rl_renewal_next(&r, 1100) == RL_RENEW_NOW);
  CHECK(rl_renewal_sent(&r, 1100) == 3000 && rl_renewal_next(&r, 1200) == RL_RENEW_NONE);
  CHECK(rl_renewal_due_now(&r, 1101)); /* on its way */
  CHECK(rl_renewal_answer(&r, 1110, 1, RL_HELD, NULL) == RL_RENEWED);
  CHECK(r.due == 2100 && rl_renewal_expires(&r) == 4100); /* from when it was sent */

  /* Not answered: tried again a tenth of the TTL later, while the TTL lasts;
     then lost, with the error. */
  rl_renewal_sent(&r, 2100);
  CHECK(rl_renewal_answer(&r, 2150, 0, 0, "connection: timed out") == RL_RENEW_RETRY && r.due == 2450);
  rl_renewal_sent(&r, 2450);
  CHECK(rl_renewal_answer(&r, 4100, 0, 0, "connection: refused") == RL_RENEW_LOST);
  CHECK(r.state == RL_LEASE_LOST && rl_renewal_next(&r, 5000) == RL_RENEW_NONE);
  CHECK(strcmp(r.why, "the watchdog could not renew it before its TTL ran out: connection: refused") == 0);

  /* Answered: gone, or another's. */
  rl_renewal_init(&r, "the renewal timer", 300, 0, 0, 0);
  CHECK(r.due == 100);
  rl_renewal_sent(&r, 100);
  CHECK(rl_renewal_answer(&r, 101, 1, RL_FREE, NULL) == RL_RENEW_LOST);
  CHECK(strcmp(r.why, "it expired or was deleted; found by the renewal timer") == 0);
  rl_renewal_init(&r, "the watchdog", 300, 0, 0, 0);
  rl_renewal_sent(&r, 100);
  CHECK(rl_renewal_answer(&r, 101, 1, RL_OTHER, NULL) == RL_RENEW_LOST);
  CHECK(strcmp(r.why, "another owner holds it now; found by the watchdog") == 0);
  /* The retry interval: 10 ms at least, a second at most; a step of 1 ms at least. */
  rl_renewal_init(&r, "the watchdog", 2, 0, 0, 0);
  CHECK(r.due == 1);
  rl_renewal_sent(&r, 1);
  CHECK(rl_renewal_answer(&r, 1, 0, 0, "connection: x") == RL_RENEW_RETRY && r.due == 11);
  rl_renewal_init(&r, "the watchdog", 60000, 0, 0, 0);
  rl_renewal_sent(&r, 20000);
  CHECK(rl_renewal_answer(&r, 20000, 0, 0, "connection: x") == RL_RENEW_RETRY && r.due == 21000);

  /* Extended by its owner while a renewal was on its way: that renewal may
     have cut the TTL back, so once more at once with the new TTL. */
  rl_renewal_init(&r, "the watchdog", 3000, 0, 0, 0);
  rl_renewal_sent(&r, 1000);
  rl_renewal_extended(&r, 9000, 1005, 1005);
  CHECK(r.due == 1005 && rl_renewal_expires(&r) == 10005);
  CHECK(rl_renewal_answer(&r, 1010, 1, RL_HELD, NULL) == RL_RENEWED && r.due == 1010);
  CHECK(rl_renewal_sent(&r, 1010) == 9000);
  CHECK(rl_renewal_answer(&r, 1020, 1, RL_HELD, NULL) == RL_RENEWED && r.due == 4010);
  /* ... or answered after the extend went out; else from the extend on. */
  rl_renewal_extended(&r, 6000, 1015, 1030);
  CHECK(r.due == 1030);
  rl_renewal_extended(&r, 6000, 1040, 1041);
  CHECK(r.due == 3040);
  /* A renewal whose answer comes after a change of TTL is not a loss. */
  rl_renewal_sent(&r, 3040);
  rl_renewal_extended(&r, 3000, 3041, 3041);
  CHECK(rl_renewal_answer(&r, 3050, 1, RL_FREE, NULL) == RL_RENEWED && r.state == RL_LEASE_HELD);

  /* A lock delay: renewals set the TTL plus the delay; the lease counts
     the TTL alone. A renewal due after the TTL ran out (the driver was
     paused) loses the lease, sending nothing; so does an answer that
     comes after it. */
  rl_renewal_init(&r, "the watchdog", 3000, 0, 0, 0);
  rl_renewal_delay(&r, 2000);
  CHECK(rl_renewal_next(&r, 1000) == RL_RENEW_NOW && rl_renewal_sent(&r, 1000) == 5000);
  CHECK(rl_renewal_answer(&r, 1010, 1, RL_HELD, NULL) == RL_RENEWED && rl_renewal_expires(&r) == 4000);
  CHECK(rl_renewal_next(&r, 3990) == RL_RENEW_NOW); /* late, but sent and answered within the TTL: renewed */
  CHECK(rl_renewal_sent(&r, 3990) == 5000 && rl_renewal_answer(&r, 3999, 1, RL_HELD, NULL) == RL_RENEWED);
  CHECK(rl_renewal_next(&r, 6989) == RL_RENEW_NOW); /* its TTL: from 3990, when that one was sent */
  CHECK(rl_renewal_next(&r, 6990) == RL_RENEW_NONE && r.state == RL_LEASE_LOST);
  CHECK(strcmp(r.why, "its TTL ran out before it could be renewed (paused?); the lock delay keeps others out;"
                      " found by the watchdog") == 0);
  rl_renewal_init(&r, "the renewal timer", 3000, 0, 0, 0);
  rl_renewal_delay(&r, 2000);
  rl_renewal_sent(&r, 2900);
  CHECK(rl_renewal_answer(&r, 3000, 1, RL_HELD, NULL) == RL_RENEW_LOST && rl_renewal_next(&r, 3000) == RL_RENEW_NONE);
  CHECK(strcmp(r.why, "its TTL ran out before its renewal came back (paused?); the lock delay keeps others out;"
                      " found by the renewal timer") == 0);
  /* Without a delay a late renewal goes, and its answer counts. */
  rl_renewal_init(&r, "the watchdog", 3000, 0, 0, 0);
  CHECK(rl_renewal_next(&r, 9000) == RL_RENEW_NOW && rl_renewal_sent(&r, 9000) == 3000);
  CHECK(rl_renewal_answer(&r, 9001, 1, RL_HELD, NULL) == RL_RENEWED);

  /* Moved to another node: at once; and once more when a renewal was on
     its way to the old one. */
  rl_renewal_init(&r, "the watchdog", 3000, 0, 0, 0);
  rl_renewal_moved(&r, 200);
  CHECK(r.due == 200);
  rl_renewal_sent(&r, 200);
  rl_renewal_moved(&r, 210);
  CHECK(r.due == 200); /* on its way: its answer decides */
  CHECK(rl_renewal_answer(&r, 220, 1, RL_HELD, NULL) == RL_RENEWED && r.due == 220);
  rl_renewal_sent(&r, 220);
  CHECK(rl_renewal_answer(&r, 230, 1, RL_HELD, NULL) == RL_RENEWED && r.due == 1220);

  /* max_hold: the renewal due after it ends the lease instead. */
  rl_renewal_init(&r, "the watchdog", 3000, 1500, 0, 10);
  CHECK(rl_renewal_next(&r, 1000) == RL_RENEW_NOW);
  rl_renewal_sent(&r, 1000);
  rl_renewal_answer(&r, 1001, 1, RL_HELD, NULL);
  CHECK(rl_renewal_next(&r, 2000) == RL_RENEW_NONE && r.state == RL_LEASE_ENDED);
  CHECK(rl_renewal_expires(&r) == 4000);
  /* The owner's extend after that is its expiry, renewing nothing. */
  rl_renewal_extended(&r, 5000, 3500, 3510);
  CHECK(rl_renewal_expires(&r) == 8500 && r.state == RL_LEASE_ENDED && rl_renewal_next(&r, 9000) == RL_RENEW_NONE);

  /* Stopped by its driver, while a renewal was on its way. */
  rl_renewal_init(&r, "the watchdog", 3000, 0, 0, 0);
  rl_renewal_sent(&r, 1000);
  rl_renewal_stop(&r, "its thread could not be restarted");
  CHECK(r.state == RL_LEASE_LOST && strcmp(r.why, "the watchdog stopped: its thread could not be restarted") == 0);
  CHECK(rl_renewal_answer(&r, 1001, 1, RL_HELD, NULL) == RL_RENEW_OVER && r.state == RL_LEASE_LOST);
  rl_renewal_init(&r, "the watchdog", 3000, 0, 0, 0);
  rl_renewal_stop(&r, NULL);
  CHECK(r.state == RL_LEASE_ENDED && rl_renewal_next(&r, 5000) == RL_RENEW_NONE);
  rl_renewal_init(&r, "the watchdog", 3000, 0, 0, 0);
  rl_renewal_stop(&r, "x");
  rl_renewal_extended(&r, 9000, 30, 30); /* no effect once lost */
  CHECK(r.ttl_ms == 3000 && rl_renewal_expires(&r) == 3000);
}

int main(void) {
  test_ops();
  test_commands();
  test_replies();
  test_takes();
  test_slots();
  test_errors();
  test_checks();
  test_call();
  test_args();
  test_renewal();
  printf("proto_test: %d checks, %d failed\n", checks, failed);
  return failed == 0 ? 0 : 1;
}
