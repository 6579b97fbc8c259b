/* SPDX-License-Identifier: MIT */
/* The scripts' names and SHA-1s: the texts and the op table are
   rl_scripts.c's, which tools/gen_scripts.lua writes from the files of
   csrc/scripts/ (its README.md says what they keep, and why). */
#include "rl_ops.h"
#include "rl_sha1.h"

#include <pthread.h>
#include <string.h>

/* The suffixes of the names the scripts get as KEYS, after
   "<prefix>{<key>}" (K_ERA's after "<prefix>{<era tag>}"). */
#define SUFFIXES(X) \
  X("") X(":fence") X(":signal") X(":queue") X(":hand") X(":waiters") X(":handoff") \
  X(":permits") X(":permits:fence") X(":permits:signal") X(":permits:waiters") \
  X(":permits:queue") X(":permits:hand") X(":permits:handed") \
  X(":rw:readers") X(":rw:writer") X(":rw:fence") X(":rw:writers") X(":rw:signal") X(":rw:waiters") \
  X(":rw:queue") X(":rw:hand") X(":fences") X(":observers")
#define SUFFIX_TEXT(s) s,
#define SUFFIX_LEN(s) sizeof s - 1,
const char *const rl_key_suffix[RL_NAMES] = { SUFFIXES(SUFFIX_TEXT) };
const unsigned char rl_key_suffix_len[RL_NAMES] = { SUFFIXES(SUFFIX_LEN) };

static char script_sha[RL_OP_COUNT][41];
static pthread_once_t script_sha_once = PTHREAD_ONCE_INIT;

const char *rl_script_text(rl_op op) { return rl_ops[op == RL_OP_TAKE ? RL_OP_ACQUIRE : op].script; }

const char *rl_op_name(rl_op op) { return rl_ops[op].name; }

int rl_op_takes_ms(rl_op op) { return (rl_ops[op].flags & RL_F_MS) != 0; }

int rl_op_takes_n(rl_op op) { return (rl_ops[op].flags & RL_F_N) != 0; }

int rl_op_resendable(rl_op op) { return (rl_ops[op].flags & RL_F_ONCE) == 0; }

int rl_op_takes_args(rl_op op) { return (rl_ops[op].flags & RL_F_ARGS) != 0; }

int rl_args_named(rl_op op) { return op == RL_OP_COUNT || (rl_ops[op].flags & RL_F_NAMED) != 0; }

int rl_args_many(rl_op op) { return op != RL_OP_COUNT && (rl_ops[op].flags & RL_F_EACH) != 0; }

void rl_guard_parts(int owned, const char **head, const char **tail) {
  *head = owned ? rl_guard_owned_head : rl_guard_fenced_head;
  *tail = owned ? rl_guard_owned_tail : rl_guard_fenced_tail;
}

/* Names every script once per process (Lua states in several threads may
   load the module at the same time). */
static void compute_script_shas(void) {
  int op;
  for (op = 0; op < RL_OP_COUNT; op++)
    if (rl_ops[op].script != NULL) rl_sha1_hex(rl_ops[op].script, strlen(rl_ops[op].script), script_sha[op]);
}

const char *rl_script_sha(rl_op op) {
  pthread_once(&script_sha_once, compute_script_shas);
  return script_sha[op == RL_OP_TAKE ? RL_OP_ACQUIRE : op];
}
