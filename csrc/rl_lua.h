/* SPDX-License-Identifier: MIT */
/*
 * The Lua binding's shared parts (redislock.core): each Lua type lives in a
 * file of its own and registers itself from there (rl_lua_open_*, as
 * luasocket's files do), with one metatable builder; the argument checks
 * and reply pushers that several of them use are in rl_lua.c.
 */
#ifndef REDISLOCK_RL_LUA_H
#define REDISLOCK_RL_LUA_H

#include "rl_compat.h"
#include "rl_conn.h"
#include "rl_proto.h"

#pragma GCC visibility push(hidden)

#define RL_CLIENT_MT "redislock.Client"
#define RL_LEASE_MT "redislock.Lease" /* rl_lua_lease.c's, made before the client's */

/*
 * A maker of one holder's lock tokens (rl_lua.c), the one place their
 * format is written: 32 hex digits from the OS random source, then
 * <holder><pid>/<unix second><label>, that tail made again only when the
 * second or the process (a fork) changed. Without a holder (buf NULL),
 * the 32 digits alone. core.tokens makes one for a Lua client, and a C
 * client has its own (client:holder).
 */
typedef struct {
  char *buf;      /* the last token made: room for the digits and the tail (rl_tokens_room) */
  const char *holder, *label; /* kept in buf's room, after the token */
  size_t hlen, llen;
  size_t tail;    /* the tail's length (0: to be made) */
  unsigned gen;
  long long second;
} rl_tokens;

/* The bytes a maker's buf needs for a holder and a label of these lengths. */
size_t rl_tokens_room(size_t hlen, size_t llen);
/* Makes m a maker into mem (rl_tokens_room bytes; NULL: no holder, the
   digits alone), copying holder and label there. */
void rl_tokens_init(rl_tokens *m, char *mem, const char *holder, size_t hlen, const char *label, size_t llen);
/* Pushes a new token of m's; raises when the OS randomness cannot be read. */
void rl_lua_push_token(lua_State *L, rl_tokens *m);

/* A client (core.new): rl_lua_client.c. */
typedef struct {
  rl_conn conn;
  rl_conn waiter; /* a second connection, for blocking waits (BLPOP) */
  char *prefix;
  size_t plen;
  int closed;
  int asking;     /* client:asking(): the next method call sends ASKING first */
  rl_tokens tokens; /* the tokens of the common acquire (client:holder); buf malloc'd */
} rl_client;


/*
 * Makes the metatable name once (liolib's createmeta): the metamethods meta,
 * and methods (NULL: none) as its __index, each with the metatable as its
 * upvalue 1 (cheaper to compare with than the registry's entry by name).
 * Leaves the stack as it was.
 */
void rl_lua_newtype(lua_State *L, const char *name, const luaL_Reg *meta, const luaL_Reg *methods);

/* Each file's type and module functions: registered into the module table
   at the top of the stack. */
void rl_lua_open_call(lua_State *L);
void rl_lua_open_client(lua_State *L);
void rl_lua_open_lease(lua_State *L);
void rl_lua_open_reader(lua_State *L);
void rl_lua_open_renewal(lua_State *L);
void rl_lua_open_watch(lua_State *L);

/* A failed call's answer (rl_lua_call.c): pushes nil, its message and,
   when it says one (rl_left_name), what is left of its take's lock. */
int rl_lua_push_failed(lua_State *L, const rl_call *call);

/* The client at idx, refusing other values and closed clients. */
rl_client *rl_lua_check_client(lua_State *L, int idx);
/* Seconds on the monotonic clock, as core.now() gives them. */
lua_Number rl_lua_now(void);
/* client:lease (rl_lua_lease.c, a method of the client). */
int rl_lua_client_lease(lua_State *L);
/* What client:lease leaves for these arguments, checked already (ttl,
   delay, max_hold and sent in ms; mt: the index of the leases' metatable,
   RL_LEASE_MT's): a lease, or nil and why not; returns how many values
   it pushed. */
int rl_lua_push_lease(lua_State *L, rl_client *c, int mt, rl_op op, const char *key, size_t klen,
                      const char *token, size_t tlen, long long ttl, long long delay, long long max_hold,
                      long long sent);
/* Stops the lease at idx (client:lease's: its metatable the one at mt)
   when it still holds its lock: 1, with what lease:stop() would say of
   its expiry in *at; 0, leaving it as it was, for any other value, or a
   lease stopped, ended or lost. */
int rl_lua_stop_held_lease(lua_State *L, int idx, int mt, lua_Number *at);

/* Argument checks shared by the client and the cosocket side (rl_lua.c). */
rl_op rl_lua_check_script(lua_State *L, int idx, int nidx, const char **key, size_t *klen,
                          const char **token, size_t *tlen, long long *ms, long long *n);
rl_op rl_lua_opt_op(lua_State *L, int idx, const char *const names[]);
void rl_lua_check_wait(lua_State *L, int idx, int opidx, const char *prefix, size_t plen, rl_cmd *cmd,
                       long long *ms);
long long rl_lua_opt_ms(lua_State *L, int idx, const char *what, long long def);
/* The TTL at idx: an integer number of milliseconds in 1..RL_MAX_MS; raises otherwise. */
long long rl_lua_check_ttl_ms(lua_State *L, int idx);
void rl_lua_push_fields(lua_State *L, int idx, const char *const names[]);
int rl_lua_command_args(lua_State *L, int first, const char ***argv, size_t **len);
void rl_lua_check_args(lua_State *L, int idx, int last, const char *prefix, size_t plen, rl_args_cmd *a);

/* Replies to plain commands, pushed (rl_lua.c). */
int rl_lua_push_reply_protected(lua_State *L);
int rl_lua_push_command_reply(lua_State *L, redisReply *r, int fidx);

#pragma GCC visibility pop

#endif
