/* SPDX-License-Identifier: MIT */
/*
 * The lock protocol, with no Lua and no I/O: the server-side scripts and their
 * SHA-1 names, the arguments of each command, the decoding of script replies,
 * tokens and the validation of keys and times. Both transports (blocking
 * sockets of rl_conn, OpenResty cosockets) share it.
 */
#ifndef REDISLOCK_RL_PROTO_H
#define REDISLOCK_RL_PROTO_H

#include <stddef.h>

#include <hiredis/hiredis.h>

#pragma GCC visibility push(hidden)

/* The operations: each but take is one server-side script that checks the token. */
typedef enum {
  RL_OP_ACQUIRE, /* SET NX PX, or refresh if the key already holds our token */
  RL_OP_RELEASE, /* compare-and-delete */
  RL_OP_EXTEND,  /* compare-and-pexpire */
  RL_OP_PTTL,    /* compare, then PTTL */
  RL_OP_ACQUIRE_FAIR, /* take it if free and first in the FIFO queue, else queue */
  RL_OP_LEAVE,   /* a registered waiter gives up (ms: the TTL it registered): leave, wake the next */
  RL_OP_TAKE,    /* the first try of an acquire: MULTI, SET NX PX, XADD of the slot's fence record, EXEC */
  RL_OP_RELEASE_ONE, /* compare-and-delete of the lock's own key only, waking nobody: a
                        release in a cluster slot half moved (one key: never TRYAGAIN) */
  RL_OP_FENCE_UP, /* Redlock's second phase: where the lock holds our token, raise the
                     fence to at least the fence chosen (in place of the ttl) */
  /* The semaphore (redislock/semaphore.lua): permits in a sorted set by expiry. */
  RL_OP_SEM_ACQUIRE, /* a permit if fewer than n are held (n: the limit) */
  RL_OP_SEM_RELEASE, /* give the permit back, wake one waiter */
  RL_OP_SEM_EXTEND,  /* the permit's expiry moves to now + ms */
  RL_OP_SEM_PTTL,    /* the permit's time left */
  RL_OP_SEM_COUNT,   /* how many permits are held (the token is not looked at) */
  /* The read-write lock (redislock/rwlock.lua): readers in a sorted set by
     expiry, the writer a plain key, waiting writers in a sorted set. */
  RL_OP_READ_ACQUIRE,  /* a read hold: no writer holds it and none waits */
  RL_OP_READ_RELEASE,  /* the last reader out wakes the waiters */
  RL_OP_READ_EXTEND,
  RL_OP_READ_PTTL,
  RL_OP_WRITE_ACQUIRE, /* the write hold: no writer, no reader; else queue as a waiting writer */
  RL_OP_WRITE_RELEASE, /* wakes the waiters */
  RL_OP_WRITE_EXTEND,
  RL_OP_WRITE_PTTL,
  RL_OP_WRITE_LEAVE,   /* a waiting writer gives up: readers may come in again */
  RL_OP_ACQUIRE_WAIT,  /* acquire, else register for a handoff (the release hands the lock over) */
  RL_OP_SEM_ACQUIRE_WAIT, /* sem_acquire, else register for a permit handed over */
  RL_OP_SEM_LEAVE,     /* a registered semaphore waiter gives up; a permit handed to it goes on */
  RL_OP_ELECT_EXTEND,  /* a leader's renewal: compare its token up to the value, then pexpire */
  RL_OP_WRITE_ACQUIRE_WAIT, /* write_acquire, else register for a handoff of the write lock */
  RL_OP_WRITE_RELEASE_ONE, /* release_one of a write hold, a read hold and a permit: their own */
  RL_OP_READ_RELEASE_ONE,  /* key alone, waking nobody (a cluster slot half moved) */
  RL_OP_SEM_RELEASE_ONE,
  /* Sent with their callers' arguments (rl_args_init), their replies whole: */
  RL_OP_MULTI_ACQUIRE,  /* a multi-key lock: all of its locks, or none */
  RL_OP_INSPECT,        /* a lock's state, for an operator */
  RL_OP_FORCE_RELEASE,  /* delete a lock whoever holds it, wake a waiter */
  RL_OP_FENCED_WRITE,   /* a write applied under a fence (guarded writes) */
  RL_OP_OWNED_WRITE,    /* a write applied while a hold is ours */
  RL_OP_ELECT_OBSERVE,  /* an election's observer registers and takes its news */
  RL_OP_ELECT_ANNOUNCE, /* a new leader, or a resign, told to the observers */
  RL_OP_ELECT_PROCLAIM, /* a leader's new value */
  RL_OP_SEM_HOLDERS,    /* a semaphore's permits held now, for an operator */
  RL_OP_COUNT
} rl_op;

/* What a script said. A script replies {status, value}, or (acquire and
   release, the common ones) one integer for both: n >= 1 is RL_HELD with
   value n, 0 is RL_FREE, n <= -1 is RL_OTHER with value -n - 2 (a PTTL). */
enum {
  RL_HELD = 1,     /* ours (acquired, released, extended, or still held) */
  RL_FREE = 0,     /* the key does not exist: expired or released */
  RL_OTHER = -1,   /* the key holds another owner's token */
  /* A take: SET took the lock, but the fence record's new ID tells no
     fence (RL_FENCE_SCALE or more IDs in one ms, or XADD refused): the
     acquire script follows, which finds our token and tells one (or why
     it cannot): csrc/scripts/README.md, "Fences". */
  RL_UNTOLD = 2
};

/* The value of a take that found the lock held: its PTTL is not known (the
   acquire script that follows the take tells it). */
#define RL_PTTL_UNKNOWN (-3)

typedef struct {
  int status;      /* RL_HELD, RL_FREE or RL_OTHER (RL_UNTOLD: a take's) */
  long long value; /* acquire: fence when held, PTTL (ms) when not; pttl: ms */
} rl_result;

/* How rl_decode classified a reply. */
typedef enum {
  RL_DECODED,  /* *out holds the script's answer */
  RL_NOSCRIPT, /* the server does not know the SHA-1: resend with EVAL */
  RL_ERROR     /* the server answered an error, or an unexpected shape */
} rl_decoded;

/* The room for an error message (a "connection: ..." or "redis: ..." one). */
#define RL_ERRLEN 512

#define RL_TOKEN_BYTES 16               /* 128 bits from the OS CSPRNG */
#define RL_TOKEN_HEX (2 * RL_TOKEN_BYTES)
/* The longest time (ms): the largest whole number a Lua number (a double)
   holds exactly, 2^53, about 285,000 years. Redis takes more (SET PX and
   PEXPIRE to LLONG_MAX less the clock), and script numbers are doubles. */
#define RL_MAX_MS 9007199254740992LL
#define RL_MAX_KEYS 9                    /* the most keys one script uses: one digit (rl_cmd_init) */
#define RL_NAMES 24                     /* the names of all scripts' keys (rl_ops.h) */
#define RL_CMD_MAXARGS (3 + RL_MAX_KEYS + 4)
#define RL_SIGNAL_MS 1000               /* a wake-up signal waits this long for a taker */
#define RL_WAITERS_SLACK_MS 1000        /* the waiters mark outlives the lock's TTL by this */
#define RL_FAIR_STAY_MS 3000            /* a fair waiter not back by then leaves the queue */
/* A lock handed to a waiter that did not take up its wake-up within this
   (it died, or gave up meanwhile) may be taken by another (csrc/scripts/). */
#define RL_CLAIM_MS 500
/* The answer of a script sent with its first keys only (rl_ops.h's
   first: the release) that needs them all: the core sends it again with
   all of them. Sent with all of them, it answers RL_NO_WAITERS for 1 when
   nobody waited: the core sends the first keys only again. */
#define RL_ALL_KEYS 2
#define RL_NO_WAITERS 3
/* A fence is at least the granting server's clock (TIME) in ms since
   RL_FENCE_EPOCH_MS (2025-01-01 UTC) times RL_FENCE_SCALE:
   csrc/scripts/README.md, "Fences". As many grants in one ms of one slot
   take no script; below 10^14 (which LuaJIT prints whole) until 2074. */
#define RL_FENCE_SCALE 64
#define RL_FENCE_EPOCH_MS 1735689600000

/*
 * One command ready to send: EVALSHA sha numkeys keys... token [ms [stay]], or
 * the same with EVAL and the script text after rl_cmd_use_eval; or, from
 * rl_wait_init, BLPOP on a signal list. argv/len point into the struct, into
 * the script table and at the caller's token (which must outlive the
 * command); the key names live in one buffer, the struct's own when they
 * fit (so the struct must not be copied), else the heap's.
 */
typedef struct {
  int argc;
  const char *argv[RL_CMD_MAXARGS];
  size_t len[RL_CMD_MAXARGS];
  rl_op op;     /* RL_OP_COUNT for a BLPOP */
  char *keys;   /* the names the op uses: "<prefix>{<key>}", the same with ":fence", ... */
  const char *key[RL_NAMES];
  size_t klen[RL_NAMES];
  char numkeys[2];
  char ms[24];
  char n[24];
  /* The names are made when they are sent (a take sends two, a release
     at first four): made has bit i for argv[3 + i]; the next one goes at
     fill; plen and uklen are the prefix's and the key's lengths in argv[3],
     which is made first. */
  unsigned made;
  char *fill;
  size_t plen, uklen;
  char inline_keys[384]; /* keys, when they fit */
} rl_cmd;

/* The script text and SHA-1 of op (computed once, on first use); take runs
   no script of its own: those of acquire, which it falls back on. */
const char *rl_script_text(rl_op op);
const char *rl_script_sha(rl_op op);
const char *rl_op_name(rl_op op);

/* The head and tail of a user's script run under a guard (owned: the owner
   check; else the fence check): see csrc/scripts/guard_*.lua. */
void rl_guard_parts(int owned, const char **head, const char **tail);

/* Whether op is sent with its caller's arguments (rl_args_init), not as a
   lock op (rl_cmd_init). */
int rl_op_takes_args(rl_op op);

/* Whether op takes a time (ms >= 1: a ttl, or fence_up's fence) and a count
   (n >= 1: sem_acquire's limit); whether it may be sent twice (every op but
   the releases: a second release would find the hold gone). */
int rl_op_takes_ms(rl_op op);
int rl_op_takes_n(rl_op op);
int rl_op_resendable(rl_op op);

/*
 * Fills cmd for op on key under prefix. token is the owner's token; ms is used
 * by the ops that take it (rl_op_takes_ms), n by those that take a count.
 * Returns 0, or -1 when out of memory.
 * Validate key with rl_check_key first. Free with rl_cmd_free. A take is
 * filled as an acquire (argv is acquire's EVALSHA) with op RL_OP_TAKE:
 * rl_cmd_bytes writes its own bytes, and rl_cmd_use_acquire turns it into the
 * acquire it falls back on.
 */
int rl_cmd_init(rl_cmd *cmd, rl_op op, const char *prefix, size_t plen,
                const char *key, size_t klen, const char *token, size_t tlen,
                long long ms, long long n);
/*
 * A script sent with its caller's arguments: an op of rl_op_takes_args, or
 * a user's script under a guard (op RL_OP_COUNT, its text and SHA-1
 * given). EVALSHA sha numkeys keys... args..., or the same with EVAL and
 * the text after rl_args_use_eval. Its reply is the caller's, whole. The
 * names, the arguments and a guard's text are copied in (one allocation).
 */
typedef struct {
  rl_op op;
  int argc;
  const char **argv;
  size_t *len;
  const char *text;   /* for EVAL */
  size_t text_len;
  char sha[41];
  char numkeys[24];
  char *mem;
} rl_args_cmd;

/*
 * Fills a for op (a guard's: op RL_OP_COUNT, with its text, tlen bytes,
 * and SHA-1). keys (nkeys of them, klen bytes each): for an op whose
 * row names its keys, the lock keys they are made of ("<prefix>{<key>}"
 * and its suffixes, all the first name's, then all the second's ...: more
 * than one key only for the multi-key acquire); else (an op whose caller
 * names its keys, and a guard's script) the names themselves. args: the
 * nargs arguments after them. Check keys and prefix first. 0, or -1 when
 * out of memory (nothing to free then). Free with rl_args_free.
 */
int rl_args_init(rl_args_cmd *a, rl_op op, const char *text, size_t tlen, const char *sha, const char *prefix,
                 size_t plen,
                 int nkeys, const char *const *keys, const size_t *klen,
                 int nargs, const char *const *args, const size_t *alen);
/* Whether op's caller names its keys, and whether op takes several lock
   keys (rl_args_init). */
int rl_args_named(rl_op op);
int rl_args_many(rl_op op);
/* Switches a from EVALSHA to EVAL (after a NOSCRIPT reply). */
void rl_args_use_eval(rl_args_cmd *a);
void rl_args_free(rl_args_cmd *a);

/*
 * Fills cmd with BLPOP on the wake-up list of the primitive op belongs to
 * (the lock's, a semaphore's or a read-write lock's), for at most ms (>= 1):
 * the shared list, or a fair waiter's own when token is not NULL. Returns 0,
 * or -1 when out of memory. Free with rl_cmd_free.
 */
int rl_wait_init(rl_cmd *cmd, rl_op op, const char *prefix, size_t plen, const char *key, size_t klen,
                 const char *token, size_t tlen, long long ms);

/*
 * The RESP bytes of a command (an array of bulk strings: what hiredis'
 * redisFormatCommandArgv writes, without its sprintf). Written into buf when
 * they fit in cap bytes, else into a new allocation; *out is where they are
 * (free it when it is not buf). Returns their length, or -1 when out of memory.
 */
long long rl_format(char *buf, size_t cap, char **out, int argc, const char *const *argv, const size_t *len);

/*
 * The bytes of cmd (see rl_format): one command; for a take, MULTI, SET key
 * token NX PX ms, XADD of the slot's fence record (MAXLEN 0, its ID the
 * server's), and EXEC, which answer RL_TAKE_REPLIES replies. Returns their
 * length, or -1 when out of memory.
 */
long long rl_cmd_bytes(const rl_cmd *cmd, char *buf, size_t cap, char **out);

#define RL_TAKE_REPLIES 4

/* How many replies the bytes of cmd are answered with: a take's
   RL_TAKE_REPLIES, else 1. */
int rl_cmd_replies(const rl_cmd *cmd);

/* Turns a take into the acquire script with the same key, token and ttl. */
void rl_cmd_use_acquire(rl_cmd *cmd);

/* Makes cmd, sent with the first of its op's keys only, send them all
   (after an answer RL_ALL_KEYS); 0 when it sent them all already. */
int rl_cmd_use_all_keys(rl_cmd *cmd);

/* Remembers whether the release cmd found somebody waiting (an answer
   RL_ALL_KEYS) or not (RL_NO_WAITERS): the next release of its name
   starts with all its keys, or with the first only (rl_cmd_init). 0 for
   an op whose row sends all its keys. */
int rl_cmd_note_waiting(const rl_cmd *cmd, int waiting);

/* A short string (letters and digits) whose hash slot is slot (0 ..
   RL_SLOTS - 1): the fence record of the locks in that slot is
   "<prefix>{<tag>}:fences" (csrc/scripts/README.md, "Fences"; an earlier
   version's era record, "<prefix>{<tag>}:era", had the same tag). The
   same tags in every process and version. */
const char *rl_era_tag(int slot);

/* Switches cmd from EVALSHA to EVAL (after a NOSCRIPT reply); a take becomes
   the acquire script. */
void rl_cmd_use_eval(rl_cmd *cmd);
void rl_cmd_free(rl_cmd *cmd);

/*
 * Classifies a reply to a script command. On RL_ERROR the server's message (or
 * a description of the unexpected reply) is copied into err.
 */
rl_decoded rl_decode(const redisReply *r, rl_result *out, char *err, size_t errlen);

/*
 * Classifies the replies to a take (MULTI, then QUEUED for SET and XADD,
 * then EXEC): RL_HELD and the fence when SET took the lock and the record's
 * new ID "<ms>-<seq>" has seq below RL_FENCE_SCALE (the fence is ms *
 * RL_FENCE_SCALE + seq); RL_UNTOLD when SET took it but the ID tells no
 * fence (or XADD was refused); RL_OTHER
 * and RL_PTTL_UNKNOWN when the lock was held; RL_ERROR with the first
 * error reply (LOADING, READONLY, MOVED ... come back at MULTI already) or
 * a description of an unexpected one.
 */
rl_decoded rl_decode_take(redisReply *const *r, rl_result *out, char *err, size_t errlen);

/*
 * The common case of rl_decode without a reader: 1 when the len bytes at buf
 * are exactly one script reply that rl_decode would take (":<n>\r\n" or
 * "*2\r\n:<status>\r\n:<value>\r\n"), filling out; else 0 (read them
 * with a reader). With take, the same for the replies of a take that took
 * the lock or found it held (see rl_decode_take).
 */
int rl_decode_bytes(const char *buf, size_t len, int take, rl_result *out);

/*
 * Describes a failed read (hiredis' reader, a connection's or the Lua binding's) whose error
 * was err (REDIS_ERR_*) with text errstr, into out: a reply nested deeper
 * than hiredis can read is "redis: ..." (the server answered, we cannot read
 * it); anything else is "connection: ..." (the bytes are not RESP). Either
 * way the connection is unusable after it. where names the server, or NULL.
 */
void rl_read_error(int err, const char *errstr, const char *where, char *out, size_t len);

/* How a connection failed, for rl_io_message. */
typedef enum { RL_IO_TIMEOUT, RL_IO_CLOSED, RL_IO_LOST } rl_io_failure;

/*
 * The message of a connection to where that failed, both transports' (no
 * I/O here): "connection: <where> did not answer within <timeout_ms> s
 * (timeout)", "... closed the connection", or "connection: lost <where>
 * (<why>)".
 */
void rl_io_message(rl_io_failure f, const char *where, const char *why, long long timeout_ms, char *out,
                   size_t len);

/*
 * What an error message says, decided here once for both transports (the
 * Lua layer reads it as core.error_class, and decides by the class, never
 * by the sentence). The messages are the library's own: "redis: <the
 * server's error reply>", "connection: ..." (rl_io_message, rl_read_error,
 * a failed connect; the cosocket transport words its own the same way),
 * "busy: ..." and "lost: ...".
 */
typedef enum {
  RL_EC_NONE,        /* not one of those messages */
  RL_EC_BUSY,        /* "busy: ...": held by another owner */
  RL_EC_LOST,        /* "lost: ...": no longer ours */
  RL_EC_TRANSIENT,   /* LOADING, BUSY: the server answers later; nothing ran */
  RL_EC_STALE,       /* READONLY, MASTERDOWN, UNBLOCKED: not (or no longer) the
                        master, or a waiter unblocked by a failover; nothing ran */
  RL_EC_DEMOTED,     /* a new connection found the node no master, and nothing
                        was sent ("redis: READONLY ... (nothing was sent)") */
  RL_EC_TRYAGAIN,    /* TRYAGAIN: a cluster slot half moved; nothing ran */
  RL_EC_CLUSTERDOWN, /* CLUSTERDOWN: no master serves the slot; nothing ran */
  RL_EC_REDIRECT,    /* MOVED, ASK: the slot is (being) served elsewhere */
  RL_EC_REFUSED,     /* NOPERM, NOSCRIPT, OOM: the command refused before it ran */
  RL_EC_SCRIPT,      /* another error from a command within a script (it names
                        "@user_script"): the script ran up to there */
  RL_EC_REDIS,       /* any other error reply */
  RL_EC_CONNECT,     /* "connection: cannot connect ...": nothing was sent */
  RL_EC_UNSENT,      /* the server closed a connection before it read the bytes,
                        which were not sent again ("connection: ... (nothing
                        was sent)"): nothing ran */
  RL_EC_TIMEOUT,     /* sent, but not answered in time: it may have run */
  RL_EC_CLOSED,      /* sent, but the connection was closed or lost before the
                        answer: it may have run */
  RL_EC_CONNECTION,  /* any other connection failure (out of memory, a reply
                        that is not RESP ...) */
  RL_EC_UNNAMED,     /* "redis: no sentinel knows master ...": the sentinels
                        name no master now (being reconfigured, or the name
                        is wrong); nothing was sent */
  RL_EC_COUNT        /* (how many there are) */
} rl_error_class;

/* The class of the len bytes of an error message at msg (see above). */
rl_error_class rl_error_class_of(const char *msg, size_t len);

/* The class's name for Lua: "busy", "lost", "transient", "stale", "demoted",
   "tryagain", "clusterdown", "redirect", "refused", "script", "redis",
   "connect", "unsent", "timeout", "closed", "connection"; NULL for
   RL_EC_NONE. */
const char *rl_error_class_name(rl_error_class c);

/* The i-th error code the class table names (from 0), with its class in
   *c; NULL past the last. */
const char *rl_error_code(size_t i, rl_error_class *c);

/* Redis Cluster's hash slots: 16384, of CRC16-XMODEM. */
#define RL_SLOTS 16384

/* The hash slot of a key name, as the cluster specification says: of its hash
   tag (what is between the first '{' and the first '}' after it) when that is
   not empty, else of the whole name. */
int rl_slot(const char *name, size_t len);

/* The hash slot of the lock on key, under any prefix: of "<prefix>{<key>}",
   the slot of every name its scripts use (they share the hash tag). Check
   key and prefix first (rl_check_key, rl_check_prefix). */
int rl_lock_slot(const char *key, size_t len);

/* A cluster redirect, from an error reply. */
typedef enum { RL_NO_REDIRECT, RL_MOVED, RL_ASK } rl_redirect_kind;

typedef struct {
  rl_redirect_kind kind;
  int slot;
  const char *host; /* into the message; hlen bytes, 0 when the node was
                       not named ("MOVED 12 :7000": the host just asked) */
  size_t hlen;
  int port;
} rl_redirect;

/* Reads "MOVED <slot> <host>:<port>" or "ASK ..." (an IPv6 host too; its
   port is after the last ':') from the len bytes of an error reply at msg.
   Returns the kind, filling *out; RL_NO_REDIRECT for any other error or a
   malformed redirect. */
rl_redirect_kind rl_parse_redirect(const char *msg, size_t len, rl_redirect *out);

/*
 * When the error message err (NUL-terminated, in a buffer of cap bytes)
 * is the server's about a command one of our scripts calls (refused to the
 * user, or unknown: renamed or disabled; "... script: <sha>, on
 * @user_script:<line>."), appends which command the library needs there
 * and in which script, read from the script's own line; else leaves err.
 */
void rl_script_hint(char *err, size_t cap);

/* NULL when key may name a lock, else why not (a sentence fragment). */
const char *rl_check_key(const char *key, size_t len);

/* NULL when prefix may start lock names, else why not ("must not ..."). */
const char *rl_check_prefix(const char *prefix, size_t len);

/*
 * Converts seconds to whole milliseconds (rounded to nearest). Returns NULL and
 * sets *ms, or returns why the value is refused (NaN, infinite, <= 0, under
 * 1 ms, over RL_MAX_MS).
 */
const char *rl_seconds_to_ms(double seconds, long long *ms);

/* Changes in a child after every fork(): a connection or random bytes made
   under another value belong to an ancestor. */
unsigned rl_fork_gen(void);

/* Monotonic milliseconds (CLOCK_MONOTONIC, the clock of core.now() in Lua):
   the clock of every lease time and I/O deadline. */
long long rl_now_ms(void);

/* Writes RL_TOKEN_HEX hex digits of OS randomness and a NUL. 0, or -1 (errno). */
int rl_token(char out[RL_TOKEN_HEX + 1]);

#pragma GCC visibility pop

#endif
