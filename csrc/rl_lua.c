/* SPDX-License-Identifier: MIT */
/*
 * redislock.core: the Lua binding of the protocol and the blocking transport.
 * The friendly API (acquire with waiting, locks, with_lock) is lua/redislock.lua;
 * this module checks its arguments again so that no call from Lua can crash the VM.
 * Here: the module, its plain functions, and the checks and reply pushers
 * the types share; each type is in a file of its own (rl_lua.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* clock_gettime, nanosleep, dladdr under -std=c99 */
#endif
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rl_lua.h"
#include "rl_proc.h"
#include "rl_sha1.h"
#include "rl_version.h"

#define MAX_REPLY_DEPTH 16

void rl_lua_newtype(lua_State *L, const char *name, const luaL_Reg *meta, const luaL_Reg *methods) {
  if (luaL_newmetatable(L, name)) {
    luaL_setfuncs(L, meta, 0);
    if (methods != NULL) {
      lua_newtable(L);
      lua_pushvalue(L, -2);
      luaL_setfuncs(L, methods, 1); /* the metatable, each method's upvalue 1 */
      lua_setfield(L, -2, "__index");
    }
  }
  lua_pop(L, 1);
}

/* The op named at idx (a name of rl_op_name); raises on any other value.
   Names are told apart by length first: every lock call names one. */
static rl_op check_op(lua_State *L, int idx) {
  static const char *ops[RL_OP_COUNT + 1];
  static size_t lens[RL_OP_COUNT];
  size_t len;
  const char *name = lua_type(L, idx) == LUA_TSTRING ? lua_tolstring(L, idx, &len) : NULL;
  int i;
  if (ops[RL_OP_COUNT - 1] == NULL) { /* the same values every time: a race writes the same */
    for (i = 0; i < RL_OP_COUNT; i++) {
      lens[i] = strlen(rl_op_name((rl_op)i));
      ops[i] = rl_op_name((rl_op)i);
    }
  }
  if (name != NULL)
    for (i = 0; i < RL_OP_COUNT; i++)
      if (lens[i] == len && memcmp(ops[i], name, len) == 0) return (rl_op)i;
  return (rl_op)luaL_checkoption(L, idx, NULL, ops); /* raises, naming the value */
}

/*
 * Checks the arguments of a script starting at idx: op (a name of
 * rl_op_name: "acquire", "release", ... "sem_acquire", "write_leave"), key,
 * token and, for the ops that take one (rl_op_takes_ms), ms (a ttl in whole
 * milliseconds; for fence_up, the fence); for sem_acquire also n (the
 * limit) at nidx. Raises on bad ones; leaves the stack as is.
 */
rl_op rl_lua_check_script(lua_State *L, int idx, int nidx, const char **key, size_t *klen,
                          const char **token, size_t *tlen, long long *ms, long long *n) {
  rl_op op = check_op(L, idx);
  const char *why;
  if (rl_op_takes_args(op)) luaL_argerror(L, idx, lua_pushfstring(L, "%s is sent by script, not eval", rl_op_name(op)));
  *key = luaL_checklstring(L, idx + 1, klen);
  *token = luaL_checklstring(L, idx + 2, tlen);
  why = rl_check_key(*key, *klen);
  if (why != NULL) luaL_argerror(L, idx + 1, why);
  luaL_argcheck(L, *tlen > 0, idx + 2, "token must not be empty");
  *ms = 0;
  *n = 0;
  if (rl_op_takes_ms(op)) {
    int isnum = 0;
    lua_Integer v = lua_tointegerx(L, idx + 3, &isnum);
    luaL_argcheck(L, lua_type(L, idx + 3) == LUA_TNUMBER && isnum && v >= 1 && v <= RL_MAX_MS,
                  idx + 3, op == RL_OP_FENCE_UP ? "fence must be an integer >= 1"
                                                : "ttl must be an integer number of milliseconds >= 1");
    *ms = (long long)v;
  }
  if (rl_op_takes_n(op)) {
    int isnum = 0;
    lua_Integer v = lua_tointegerx(L, nidx, &isnum);
    luaL_argcheck(L, nidx > 0, idx, "this op needs a count, which this call cannot take");
    luaL_argcheck(L, lua_type(L, nidx) == LUA_TNUMBER && isnum && v >= 1 && v <= RL_MAX_MS, nidx,
                  op == RL_OP_SEM_ACQUIRE || op == RL_OP_SEM_ACQUIRE_WAIT ? "limit must be an integer >= 1"
                                          : "the TTL to hand over must be an integer number of milliseconds >= 1");
    *n = (long long)v;
  }
  return op;
}

/* Pushes r as a Lua value: strings, integers, tables; nil bulk -> false. */
static void push_reply(lua_State *L, const redisReply *r, int depth) {
  size_t i;
  switch (r->type) {
  case REDIS_REPLY_STRING:
  case REDIS_REPLY_STATUS:
    lua_pushlstring(L, r->str, r->len);
    break;
  case REDIS_REPLY_INTEGER:
    lua_pushinteger(L, (lua_Integer)r->integer);
    break;
  case REDIS_REPLY_ARRAY:
    if (depth >= MAX_REPLY_DEPTH) luaL_error(L, "redislock: reply nested too deeply");
    luaL_checkstack(L, 2, "reply nested too deeply");
    lua_createtable(L, (int)r->elements, 0);
    for (i = 0; i < r->elements; i++) {
      push_reply(L, r->element[i], depth + 1);
      lua_rawseti(L, -2, (int)i + 1);
    }
    break;
  case REDIS_REPLY_ERROR: /* inside an array (MULTI/EXEC): { err = "..." } */
    lua_createtable(L, 0, 1);
    lua_pushlstring(L, r->str, r->len);
    lua_setfield(L, -2, "err");
    break;
  default: /* REDIS_REPLY_NIL */
    lua_pushboolean(L, 0);
    break;
  }
}

/* Protected body of push_reply, so an allocation error cannot leak the reply. */
int rl_lua_push_reply_protected(lua_State *L) {
  const redisReply *r = (const redisReply *)lua_touserdata(L, 1);
  push_reply(L, r, 0);
  return 1;
}

/*
 * Collects the arguments from first to the top of the stack (strings or
 * numbers, at least one) into argv/len, which live in a userdata pushed on
 * the stack (collected even if something later raises). Returns their count.
 */
int rl_lua_command_args(lua_State *L, int first, const char ***argv, size_t **len) {
  int argc = lua_gettop(L) - first + 1, i;
  luaL_argcheck(L, argc >= 1, first, "command name expected");
  for (i = first; i < first + argc; i++) {
    int t = lua_type(L, i);
    if (t != LUA_TSTRING && t != LUA_TNUMBER)
      luaL_argerror(L, i, lua_pushfstring(L, "string or number expected, got %s",
                                          luaL_typename(L, i)));
  }
  *argv = (const char **)lua_newuserdatauv(L, (size_t)argc * (sizeof **argv + sizeof **len), 0);
  *len = (size_t *)(*argv + argc);
  for (i = 0; i < argc; i++) (*argv)[i] = lua_tolstring(L, first + i, &(*len)[i]);
  return argc;
}

/*
 * Pushes a reply to a plain command and frees it: the value (a nil bulk is
 * false), or nil and "redis: <message>" for an error reply. Returns the
 * number of values pushed. rl_lua_push_reply_protected must already be at stack
 * index fidx (pushed before r existed: pushing a C function allocates on
 * LuaJIT, and nothing may raise while r is alive).
 */
int rl_lua_push_command_reply(lua_State *L, redisReply *r, int fidx) {
  char err[RL_ERRLEN];
  int status;
  if (r->type == REDIS_REPLY_ERROR) {
    snprintf(err, sizeof err, "redis: %.*s", (int)r->len, r->str);
    freeReplyObject(r);
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  lua_pushvalue(L, fidx);
  lua_pushlightuserdata(L, r);
  status = lua_pcall(L, 1, 1, 0);
  freeReplyObject(r);
  if (status != 0) return lua_error(L);
  return 1;
}

/*
 * Checks the arguments of a script sent with its caller's arguments, from
 * idx to last: op (the name of an op that takes them, rl_op_takes_args; or
 * a user's script under a guard, the table { text =, sha = } that
 * core.guard_script's results make), keys (one lock key; an array of lock
 * keys for the multi-key acquire; an array of the names themselves for an
 * op whose caller names them, and a guard's), then the script's arguments
 * (strings or numbers). Fills a (rl_args_init: free with rl_args_free);
 * raises only before that.
 */
void rl_lua_check_args(lua_State *L, int idx, int last, const char *prefix, size_t plen, rl_args_cmd *a) {
  const char *text = NULL, *sha = NULL, **keys, **args;
  size_t *klen, *alen, len, tlen = 0;
  rl_op op = RL_OP_COUNT;
  int nkeys, nargs = last - idx - 1, i;
  if (lua_type(L, idx) == LUA_TTABLE) { /* a guard's script: its fields stay on the stack */
    lua_getfield(L, idx, "text");
    lua_getfield(L, idx, "sha");
    text = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &tlen) : NULL;
    sha = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
    luaL_argcheck(L, text != NULL && sha != NULL && len == 40, idx, "a guard's script { text =, sha = } expected");
  } else {
    op = check_op(L, idx);
    if (!rl_op_takes_args(op)) luaL_argerror(L, idx, lua_pushfstring(L, "%s is sent by eval", rl_op_name(op)));
  }
  luaL_argcheck(L, last >= idx + 1, idx + 1, "a key, or an array of keys, expected");
  nkeys = lua_type(L, idx + 1) == LUA_TTABLE ? (int)lua_rawlen(L, idx + 1) : 1;
  luaL_argcheck(L, nkeys >= 1 && nkeys <= 100000, idx + 1, "a key, or an array of keys, expected");
  luaL_argcheck(L, lua_type(L, idx + 1) == LUA_TTABLE || !rl_args_named(op), idx + 1, "an array of keys expected");
  luaL_argcheck(L, nkeys == 1 || rl_args_named(op) || rl_args_many(op), idx + 1,
                "one key expected");
  luaL_argcheck(L, nargs >= 0 && nargs <= 100000, idx + 2, "too many arguments");
  keys = (const char **)lua_newuserdatauv(L, (size_t)nkeys * (sizeof *keys + sizeof *klen), 0);
  klen = (size_t *)(keys + nkeys);
  for (i = 0; i < nkeys; i++) {
    /* A table's strings stay alive in it, a lone key at idx + 1: popped. */
    if (lua_type(L, idx + 1) == LUA_TTABLE) lua_rawgeti(L, idx + 1, i + 1);
    else lua_pushvalue(L, idx + 1);
    if (lua_type(L, -1) != LUA_TSTRING)
      luaL_argerror(L, idx + 1, lua_pushfstring(L, "key %d must be a string", i + 1));
    keys[i] = lua_tolstring(L, -1, &klen[i]);
    lua_pop(L, 1);
    if (!rl_args_named(op)) {
      const char *why = rl_check_key(keys[i], klen[i]);
      if (why != NULL) luaL_argerror(L, idx + 1, why);
    }
  }
  args = (const char **)lua_newuserdatauv(L, (size_t)(nargs > 0 ? nargs : 1) * (sizeof *args + sizeof *alen), 0);
  alen = (size_t *)(args + (nargs > 0 ? nargs : 1));
  for (i = 0; i < nargs; i++) {
    int t = lua_type(L, idx + 2 + i);
    if (t != LUA_TSTRING && t != LUA_TNUMBER)
      luaL_argerror(L, idx + 2 + i, lua_pushfstring(L, "string or number expected, got %s",
                                                    luaL_typename(L, idx + 2 + i)));
    args[i] = lua_tolstring(L, idx + 2 + i, &alen[i]);
  }
  if (rl_args_init(a, op, text, tlen, sha, prefix, plen, nkeys, keys, klen, nargs, args, alen) != 0)
    luaL_error(L, "redislock: out of memory");
}

/* An optional op name at idx, one of names (NULL-ended, the first the
   default); the rl_op of that name. */
rl_op rl_lua_opt_op(lua_State *L, int idx, const char *const names[]) {
  const char *name = names[luaL_checkoption(L, idx, names[0], names)];
  int op;
  for (op = 0; op < RL_OP_COUNT; op++)
    if (strcmp(rl_op_name((rl_op)op), name) == 0) break;
  return (rl_op)op;
}

/*
 * Checks the arguments of a wait starting at idx: key, token (nil for the
 * shared list) and ms (>= 1); at opidx the op whose wake-up list it is (nil:
 * the lock's; "sem_acquire", "read_acquire" or "write_acquire"). Fills cmd
 * with the BLPOP (free with rl_cmd_free).
 */
void rl_lua_check_wait(lua_State *L, int idx, int opidx, const char *prefix, size_t plen, rl_cmd *cmd,
                       long long *ms) {
  static const char *const waits[] = { "acquire", "sem_acquire", "read_acquire", "write_acquire", NULL };
  size_t klen, tlen = 0;
  const char *key = luaL_checklstring(L, idx, &klen);
  const char *token = lua_isnil(L, idx + 1) ? NULL : luaL_checklstring(L, idx + 1, &tlen);
  const char *why = rl_check_key(key, klen);
  int isnum = 0;
  lua_Integer v = lua_tointegerx(L, idx + 2, &isnum);
  rl_op op = rl_lua_opt_op(L, opidx, waits);
  if (why != NULL) luaL_argerror(L, idx, why);
  luaL_argcheck(L, token == NULL || tlen > 0, idx + 1, "token must not be empty");
  luaL_argcheck(L, lua_type(L, idx + 2) == LUA_TNUMBER && isnum && v >= 1 && v <= RL_MAX_MS, idx + 2,
                "wait must be an integer number of milliseconds >= 1");
  *ms = (long long)v;
  if (rl_wait_init(cmd, op, prefix, plen, key, klen, token, tlen, *ms) != 0)
    luaL_error(L, "redislock: out of memory");
}

/* An optional integer argument >= 0 (milliseconds); def when nil. */
long long rl_lua_opt_ms(lua_State *L, int idx, const char *what, long long def) {
  int isnum = 0;
  lua_Integer v;
  if (lua_isnoneornil(L, idx)) return def;
  v = lua_tointegerx(L, idx, &isnum);
  if (lua_type(L, idx) != LUA_TNUMBER || !isnum || v < 0 || v > RL_MAX_MS)
    luaL_argerror(L, idx, lua_pushfstring(L, "%s must be an integer number of milliseconds >= 0", what));
  return (long long)v;
}

long long rl_lua_check_ttl_ms(lua_State *L, int idx) {
  int isnum = 0;
  lua_Integer ttl = lua_tointegerx(L, idx, &isnum);
  luaL_argcheck(L, lua_type(L, idx) == LUA_TNUMBER && isnum && ttl >= 1 && ttl <= RL_MAX_MS, idx,
                "ttl must be an integer number of milliseconds >= 1");
  return (long long)ttl;
}

/*
 * Sets the stack's top to idx, then pushes the fields names (NULL ends the
 * list) of the table at idx, or as many nils when idx is nil; raises a bad
 * argument idx for anything else. A method's options table, read into
 * stack slots that its checks can name.
 */
void rl_lua_push_fields(lua_State *L, int idx, const char *const names[]) {
  int i;
  if (lua_isnoneornil(L, idx)) { /* no table: nils (settop fills with them) */
    for (i = 0; names[i] != NULL; i++) {}
    lua_settop(L, idx); /* not a surplus argument's value in an option's slot */
    lua_settop(L, idx + i);
    return;
  }
  lua_settop(L, idx);
  luaL_checktype(L, idx, LUA_TTABLE);
  for (i = 0; names[i] != NULL; i++) lua_getfield(L, idx, names[i]);
}

/* core.token([suffix]) -> 32 hex digits (128 bits) from the OS random
   source, then suffix (who holds it: one string made in one step). */
static int core_token(lua_State *L) {
  char tok[RL_TOKEN_HEX + 256];
  size_t slen = 0;
  const char *suffix = luaL_optlstring(L, 1, "", &slen);
  luaL_Buffer b;
  if (rl_token(tok) != 0)
    return luaL_error(L, "redislock: cannot read the OS random source (%s)", strerror(errno));
  if (slen <= sizeof tok - RL_TOKEN_HEX) { /* the usual holder's suffix: one copy, no buffer */
    memcpy(tok + RL_TOKEN_HEX, suffix, slen);
    lua_pushlstring(L, tok, RL_TOKEN_HEX + slen);
    return 1;
  }
  luaL_buffinit(L, &b);
  luaL_addlstring(&b, tok, RL_TOKEN_HEX);
  luaL_addlstring(&b, suffix, slen);
  luaL_pushresult(&b);
  return 1;
}

size_t rl_tokens_room(size_t hlen, size_t llen) {
  /* the digits, the holder, 20 digits of pid, "/", 20 of seconds, the
     label, snprintf's NUL; then the holder and the label kept */
  return RL_TOKEN_HEX + hlen + 20 + 1 + 20 + llen + 1 + hlen + llen;
}

void rl_tokens_init(rl_tokens *m, char *mem, const char *holder, size_t hlen, const char *label, size_t llen) {
  memset(m, 0, sizeof *m);
  if (mem == NULL) return;
  m->buf = mem;
  m->holder = mem + rl_tokens_room(hlen, llen) - hlen - llen;
  m->label = m->holder + hlen;
  memcpy((char *)m->holder, holder, hlen);
  memcpy((char *)m->label, label, llen);
  m->hlen = hlen;
  m->llen = llen;
}

void rl_lua_push_token(lua_State *L, rl_tokens *m) {
  char hex[RL_TOKEN_HEX + 1];
  unsigned gen;
  long long now;
  if (rl_token(hex) != 0) luaL_error(L, "redislock: cannot read the OS random source (%s)", strerror(errno));
  if (m->buf == NULL) {
    lua_pushlstring(L, hex, RL_TOKEN_HEX);
    return;
  }
  gen = rl_fork_gen();
  now = (long long)time(NULL);
  if (m->tail == 0 || gen != m->gen || now != m->second) {
    char *p = m->buf + RL_TOKEN_HEX;
    memcpy(p, m->holder, m->hlen);
    p += m->hlen;
    p += snprintf(p, 20 + 1 + 20 + 1, "%ld/%lld", (long)getpid(), now);
    memcpy(p, m->label, m->llen);
    m->tail = (size_t)(p + m->llen - (m->buf + RL_TOKEN_HEX));
    m->gen = gen;
    m->second = now;
  }
  memcpy(m->buf, hex, RL_TOKEN_HEX);
  lua_pushlstring(L, m->buf, RL_TOKEN_HEX + m->tail);
}

/* make() (core.tokens'): a new token of the maker at upvalue 1. */
static int make_token(lua_State *L) {
  rl_lua_push_token(L, (rl_tokens *)lua_touserdata(L, lua_upvalueindex(1)));
  return 1;
}

/*
 * core.tokens(holder, label) -> make: make() -> a new lock token (see
 * rl_tokens): 32 hex digits, then holder ("/<host>/"; nil or false: the
 * digits alone), the pid, "/", the unix second and label ("/<label>" or
 * ""). The tokens of every hold of a client (redislock/hold.lua's
 * new_token), as its C client's common acquire makes them.
 */
static int core_tokens(lua_State *L) {
  size_t hlen = 0, llen = 0;
  const char *holder = lua_toboolean(L, 1) ? luaL_checklstring(L, 1, &hlen) : NULL;
  const char *label = luaL_checklstring(L, 2, &llen);
  size_t room = holder != NULL ? rl_tokens_room(hlen, llen) : 0;
  rl_tokens *m = (rl_tokens *)lua_newuserdatauv(L, sizeof *m + room, 0);
  rl_tokens_init(m, holder != NULL ? (char *)(m + 1) : NULL, holder, hlen, label, llen);
  lua_pushcclosure(L, make_token, 1);
  return 1;
}

/* core.fork_gen() -> a number that changes in a child after every fork()
   (cheaper than asking the pid on every call). */
static int core_fork_gen(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)rl_fork_gen());
  return 1;
}

/* core.ms(seconds) -> integer milliseconds | nil, why (a fragment: "must be > 0"). */
static int core_ms(lua_State *L) {
  long long ms = 0;
  const char *why;
  if (lua_type(L, 1) != LUA_TNUMBER) {
    lua_pushnil(L);
    lua_pushfstring(L, "number expected, got %s", luaL_typename(L, 1));
    return 2;
  }
  why = rl_seconds_to_ms((double)lua_tonumber(L, 1), &ms);
  if (why != NULL) {
    lua_pushnil(L);
    lua_pushstring(L, why);
    return 2;
  }
  lua_pushinteger(L, (lua_Integer)ms);
  return 1;
}

/* core.key_problem(key) -> nil when key may name a lock, else why not. */
static int core_key_problem(lua_State *L) {
  size_t len;
  const char *key = luaL_checklstring(L, 1, &len);
  const char *why = rl_check_key(key, len);
  if (why == NULL) lua_pushnil(L);
  else lua_pushstring(L, why);
  return 1;
}

/* core.prefix_problem(prefix) -> nil when prefix may start lock names, else why
   not (a fragment: "must not contain ..."). */
static int core_prefix_problem(lua_State *L) {
  size_t len;
  const char *prefix = luaL_checklstring(L, 1, &len);
  const char *why = rl_check_prefix(prefix, len);
  if (why == NULL) lua_pushnil(L);
  else lua_pushstring(L, why);
  return 1;
}

/* core.slot(name) -> the Redis Cluster hash slot of a key name (0..16383). */
static int core_slot(lua_State *L) {
  size_t len;
  const char *name = luaL_checklstring(L, 1, &len);
  lua_pushinteger(L, rl_slot(name, len));
  return 1;
}

/*
 * core.guard_script(owned, text) -> script, sha: the user's script text run
 * under a guard (owned: the hold's owner check, else the fence check; see
 * rl_guard_parts), and its SHA-1 for EVALSHA.
 */
static int core_guard_script(lua_State *L) {
  int owned = lua_toboolean(L, 1);
  size_t len;
  const char *text = luaL_checklstring(L, 2, &len), *head, *tail;
  char sha[41];
  luaL_Buffer b;
  rl_guard_parts(owned, &head, &tail);
  luaL_buffinit(L, &b);
  luaL_addstring(&b, head);
  luaL_addlstring(&b, text, len);
  luaL_addstring(&b, tail);
  luaL_pushresult(&b);
  text = lua_tolstring(L, -1, &len);
  rl_sha1_hex(text, len, sha);
  lua_pushstring(L, sha);
  return 2;
}

/* core.lock_slot(key) -> the hash slot of the lock on key (of all its names). */
static int core_lock_slot(lua_State *L) {
  size_t len;
  const char *key = luaL_checklstring(L, 1, &len);
  const char *why = rl_check_key(key, len);
  if (why != NULL) return luaL_argerror(L, 1, why);
  lua_pushinteger(L, rl_lock_slot(key, len));
  return 1;
}

/* core.era_tag(slot) -> the tag of the slot's fence record (rl_era_tag):
   the record is "<prefix>{<tag>}:fences". */
static int core_era_tag(lua_State *L) {
  lua_Integer slot = luaL_checkinteger(L, 1);
  luaL_argcheck(L, slot >= 0 && slot < RL_SLOTS, 1, "slot must be in 0..16383");
  lua_pushstring(L, rl_era_tag((int)slot));
  return 1;
}

/* core.io_message(where, err, timeout_ms) -> the "connection: ..." message
   of a cosocket that failed with err ("timeout", "closed", or another
   reason), as the C transport words it (rl_io_message). */
static int core_io_message(lua_State *L) {
  const char *where = luaL_checkstring(L, 1), *err = luaL_checkstring(L, 2);
  long long ms = rl_lua_opt_ms(L, 3, "timeout", 0);
  char out[RL_ERRLEN];
  rl_io_failure f = strcmp(err, "timeout") == 0 ? RL_IO_TIMEOUT : strcmp(err, "closed") == 0 ? RL_IO_CLOSED
                                                                                             : RL_IO_LOST;
  rl_io_message(f, where, err, ms, out, sizeof out);
  lua_pushstring(L, out);
  return 1;
}

/* core.redirect(message) -> "MOVED" | "ASK", slot, host, port; or nil. The
   message is an error reply, with or without redislock's "redis: " before
   it. host is "" when the redirect names none (the node just asked). */
static int core_redirect(lua_State *L) {
  size_t len;
  const char *msg = luaL_checklstring(L, 1, &len);
  rl_redirect r;
  if (len >= 7 && memcmp(msg, "redis: ", 7) == 0) {
    msg += 7;
    len -= 7;
  }
  if (rl_parse_redirect(msg, len, &r) == RL_NO_REDIRECT) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushstring(L, r.kind == RL_MOVED ? "MOVED" : "ASK");
  lua_pushinteger(L, r.slot);
  lua_pushlstring(L, r.host, r.hlen);
  lua_pushinteger(L, r.port);
  return 4;
}

/* core.error_class(err) -> the class of an error message (rl_error_class:
   "transient", "stale", "connect" ...), or nil for another value. Asked on
   the error path only: a success classifies nothing. The names are its
   upvalues (upvalue c + 1 is class c's: nil for RL_EC_NONE), made once. */
static int core_error_class(lua_State *L) {
  size_t len;
  const char *msg = lua_type(L, 1) == LUA_TSTRING ? lua_tolstring(L, 1, &len) : NULL;
  if (msg == NULL) lua_pushnil(L);
  else lua_pushvalue(L, lua_upvalueindex((int)rl_error_class_of(msg, len) + 1));
  return 1;
}

/* Sets core.error_class in the module table on top of the stack. */
static void push_error_class(lua_State *L) {
  for (int c = 0; c < RL_EC_COUNT; c++) {
    const char *name = rl_error_class_name((rl_error_class)c);
    if (name == NULL) lua_pushnil(L);
    else lua_pushstring(L, name);
  }
  lua_pushcclosure(L, core_error_class, RL_EC_COUNT);
  lua_setfield(L, -2, "error_class");
}

/* Pushes { LOADING = "transient", READONLY = "stale", ... }: the error codes
   that have a class of their own (rl_error_code). */
static void push_error_codes(lua_State *L) {
  rl_error_class c;
  const char *code;
  lua_newtable(L);
  for (size_t i = 0; (code = rl_error_code(i, &c)) != NULL; i++) {
    lua_pushstring(L, rl_error_class_name(c));
    lua_setfield(L, -2, code);
  }
}

lua_Number rl_lua_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec / 1e9;
}

/* core.now() -> seconds on the monotonic clock (shared by all processes). */
static int core_now(lua_State *L) {
  lua_pushnumber(L, rl_lua_now());
  return 1;
}

/* core.sleep(seconds): blocks the thread; seconds >= 0. */
static int core_sleep(lua_State *L) {
  lua_Number s = luaL_checknumber(L, 1);
  struct timespec ts;
  luaL_argcheck(L, s >= 0 && s <= 86400.0 * 365, 1, "seconds must be in 0..31536000");
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (lua_Number)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
  return 0;
}

/* Pushes { acquire = { sha = ..., text = ... }, ... } for specs and tools;
   an op sent by script (with its caller's arguments) also has named. */
static void push_scripts(lua_State *L) {
  int op;
  lua_createtable(L, 0, RL_OP_COUNT);
  for (op = 0; op < RL_OP_COUNT; op++) {
    if (op == RL_OP_TAKE) continue; /* no script of its own */
    lua_createtable(L, 0, 2);
    lua_pushstring(L, rl_script_sha((rl_op)op));
    lua_setfield(L, -2, "sha");
    lua_pushstring(L, rl_script_text((rl_op)op));
    lua_setfield(L, -2, "text");
    if (rl_op_takes_args((rl_op)op)) { /* sent by script: its keys named by its caller, or made of lock keys */
      lua_pushboolean(L, rl_args_named((rl_op)op));
      lua_setfield(L, -2, "named");
    }
    lua_setfield(L, -2, rl_op_name((rl_op)op));
  }
}

static const luaL_Reg core_functions[] = {
  { "token", core_token },
  { "tokens", core_tokens },
  { "fork_gen", core_fork_gen },
  { "ms", core_ms },
  { "key_problem", core_key_problem },
  { "prefix_problem", core_prefix_problem },
  { "slot", core_slot },
  { "lock_slot", core_lock_slot },
  { "guard_script", core_guard_script },
  { "era_tag", core_era_tag },
  { "redirect", core_redirect },
  { "io_message", core_io_message },
  { "now", core_now },
  { "sleep", core_sleep },
  { NULL, NULL }
};

RL_EXPORT int luaopen_redislock_core(lua_State *L);

/*
 * Keeps this module mapped until the process ends, whatever Lua unloads: the
 * watchdog thread runs its code, and a state closing (which joins the thread
 * first) must not pull it away from a thread of another state.
 */
static void keep_loaded(void) {
  static const char here = 0; /* an object in this module (ISO C forbids a function pointer here) */
  Dl_info info;
  if (dladdr(&here, &info) != 0 && info.dli_fname != NULL)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NODELETE); /* never closed, on purpose */
}

/* Leaves the module table on the stack. */
RL_EXPORT int luaopen_redislock_core(lua_State *L) {
  keep_loaded();
  luaL_newlib(L, core_functions);
  rl_lua_open_call(L);
  rl_lua_open_lease(L); /* before the client's: its common case keeps the leases' metatable */
  rl_lua_open_client(L);
  rl_lua_open_reader(L);
  rl_lua_open_renewal(L);
  rl_lua_open_watch(L);
  rl_proc_register(L);
  lua_pushliteral(L, RL_VERSION);
  lua_setfield(L, -2, "_VERSION");
  lua_pushinteger(L, RL_MAX_MS);
  lua_setfield(L, -2, "MAX_MS");
  /* A fence stands for a fence record's ID "<ms>-<seq>":
     (ms - FENCE_EPOCH_MS) * FENCE_SCALE + seq (csrc/scripts/README.md). */
  lua_pushinteger(L, RL_FENCE_SCALE);
  lua_setfield(L, -2, "FENCE_SCALE");
  lua_pushinteger(L, (lua_Integer)RL_FENCE_EPOCH_MS);
  lua_setfield(L, -2, "FENCE_EPOCH_MS");
  push_scripts(L);
  lua_setfield(L, -2, "scripts");
  push_error_codes(L);
  lua_setfield(L, -2, "error_codes");
  push_error_class(L);
  return 1;
}
