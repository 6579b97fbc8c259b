/* SPDX-License-Identifier: MIT */
/* The ops of the core, one row each, and the scripts (rl_scripts.c, which
   tools/gen_scripts.lua writes from the files of csrc/scripts/): what rl_proto.c
   needs to build their commands. Internal to the core (rl_proto.h is its
   face). */
#ifndef REDISLOCK_RL_OPS_H
#define REDISLOCK_RL_OPS_H

#include "rl_proto.h"

#pragma GCC visibility push(hidden)

#define RL_STR_(x) #x
#define RL_STR(x) RL_STR_(x)

/* The names of the scripts' keys, as indexes into rl_cmd.key/klen and
   rl_key_suffix (their suffixes after "<prefix>{<key>}"). Each primitive has
   names of its own: a semaphore and a lock of the same name do not meet. */
enum { K_LOCK, K_FENCE, K_SIGNAL, K_QUEUE, K_HAND, K_WAITERS, K_HANDOFF,
       K_PERMITS, K_PFENCE, K_PSIGNAL, K_PWAITERS, K_PQUEUE, K_PHAND, K_PHANDED,
       K_READERS, K_WRITER, K_RWFENCE, K_WRITERS, K_RWSIGNAL, K_RWWAITERS, K_RWQUEUE, K_RWHAND,
       K_ERA, /* the slot's fence record, "<prefix>{<era tag>}:fences", not the key's (named
                after the era record of earlier versions, which it replaced) */
       K_OBSERVERS /* an election's observers */ };

extern const char *const rl_key_suffix[RL_NAMES];
extern const unsigned char rl_key_suffix_len[RL_NAMES]; /* their lengths */

/* rl_cmd_init writes an op's number of keys as one digit. */
typedef char rl_numkeys_fit_one_digit[RL_MAX_KEYS <= 9 ? 1 : -1];

/* An op's flags: it takes a time (ms >= 1: a ttl, or fence_up's fence) and
   a count (n >= 1: sem_acquire's limit; a registering try's TTL to hand
   over, in ms); it is never sent twice (a release:
   a second one would find the hold gone); it waits with a stay (a fair
   waiter, or a waiting writer, leaves the queue unless it comes back
   within RL_FAIR_STAY_MS). */
enum { RL_F_MS = 1, RL_F_N = 2, RL_F_ONCE = 4, RL_F_STAY = 8,
       /* sent with its caller's arguments (rl_args_init); with its row's
          keys for each of several lock keys (the multi-key acquire); its
          caller names its keys (guarded writes) */
       RL_F_ARGS = 16, RL_F_EACH = 32, RL_F_NAMED = 64 };

/* One op: its name (as Lua calls it), its script (NULL for a take, which
   runs none: it falls back on acquire's), the names its script gets as
   KEYS, in order (-1 ends them), its flags, and how many of its names its
   first send passes (0: all; else the script answers RL_ALL_KEYS when it
   needs the others, and gets them all in a second send: the release,
   whose wake-up needs names its common case does not); a script file's
   "--! op" line. */
typedef struct {
  const char *name;
  const char *script;
  signed char keys[RL_MAX_KEYS + 1];
  unsigned char flags;
  unsigned char first;
} rl_op_row;

extern const rl_op_row rl_ops[RL_OP_COUNT];

/* The head and tail of a user's script run under a guard (rl_guard_parts). */
extern const char rl_guard_fenced_head[], rl_guard_fenced_tail[];
extern const char rl_guard_owned_head[], rl_guard_owned_tail[];

#pragma GCC visibility pop

#endif
