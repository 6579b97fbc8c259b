/* SPDX-License-Identifier: MIT */
/*
 * redislock.core: the Lua binding of the protocol and the blocking transport.
 * The friendly API (acquire with waiting, locks, with_lock) is lua/redislock.lua;
 * this module checks its arguments again so that no call from Lua can crash the VM.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* clock_gettime, nanosleep, dladdr under -std=c99 */
#endif
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rl_compat.h"
#include "rl_conn.h"
#include "rl_proc.h"
#include "rl_proto.h"
#include "rl_sentinel.h"
#include "rl_sha1.h"
#include "rl_version.h"
#include "rl_watchdog.h"

#define CLIENT_MT "redislock.Client"
#define READER_MT "redislock.Reader"
#define LEASE_MT "redislock.Lease"
#define WATCHDOG_MT "redislock.Watchdog"
#define WATCH_MT "redislock.SentinelWatch"
#define MAX_REPLY_DEPTH 16

typedef struct {
  rl_conn conn;
  rl_conn waiter; /* a second connection, for blocking waits (BLPOP) */
  char *prefix;
  size_t plen;
  int closed;
  int asking;     /* client:asking(): the next method call sends ASKING first */
} rl_client;

/* Arms conn for one method call with the ASKING client:asking() asked for. */
static void arm_asking(rl_client *c, rl_conn *conn) {
  conn->asking = c->asking;
  c->asking = 0;
}

/* The client at idx, refusing other values and closed clients. */
static rl_client *check_client(lua_State *L, int idx) {
  rl_client *c = (rl_client *)luaL_checkudata(L, idx, CLIENT_MT);
  if (c->closed) luaL_argerror(L, idx, "client is closed");
  return c;
}

/* Releases everything the client owns. Idempotent: __gc, __close and close(). */
static void client_free(rl_client *c) {
  rl_conn_free(&c->conn);
  rl_conn_free(&c->waiter);
  free(c->prefix);
  c->prefix = NULL;
  c->closed = 1;
}

/* Reads integer field name of the table at 1 into *out (def when nil). */
static lua_Integer opt_integer(lua_State *L, const char *name, lua_Integer def,
                               lua_Integer min, lua_Integer max) {
  int isnum = 0;
  lua_Integer v;
  lua_getfield(L, 1, name);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return def;
  }
  v = lua_tointegerx(L, -1, &isnum);
  if (lua_type(L, -1) != LUA_TNUMBER || !isnum || v < min || v > max)
    luaL_argerror(L, 1, lua_pushfstring(L, "field '%s' must be an integer in %d..%d",
                                        name, (int)min, (int)max));
  lua_pop(L, 1);
  return v;
}

/* Pushes string field name of the table at 1 (or leaves nil); returns it or NULL. */
static const char *opt_string(lua_State *L, const char *name) {
  lua_getfield(L, 1, name);
  if (lua_isnil(L, -1)) return NULL;
  if (lua_type(L, -1) != LUA_TSTRING)
    luaL_argerror(L, 1, lua_pushfstring(L, "field '%s' must be a string", name));
  if (strlen(lua_tostring(L, -1)) != lua_rawlen(L, -1))
    luaL_argerror(L, 1, lua_pushfstring(L, "field '%s' must not contain NUL", name));
  return lua_tostring(L, -1);
}

/*
 * Reads the TLS settings of the opts table at 1 into *o: field tls is nil or
 * false (none: returns 0), true (verified against the system store), or a
 * table with ca, cert, key, server_name (strings) and verify (boolean,
 * default true). Raises on anything else. Pushes the strings it reads, which
 * stay on the stack (and alive) for the caller.
 */
static int read_tls(lua_State *L, rl_tls_opts *o) {
  static const char *const fields[] = { "ca", "cert", "key", "server_name", NULL };
  const char **slot[4];
  int t;
  slot[0] = &o->ca, slot[1] = &o->cert, slot[2] = &o->key, slot[3] = &o->server_name;
  memset(o, 0, sizeof *o);
  o->verify = 1;
  lua_getfield(L, 1, "tls");
  t = lua_gettop(L);
  if (lua_isnil(L, t) || (lua_isboolean(L, t) && !lua_toboolean(L, t))) return 0;
  if (lua_isboolean(L, t)) return 1;
  if (!lua_istable(L, t)) luaL_argerror(L, 1, "field 'tls' must be a boolean or a table");
  for (int i = 0; fields[i] != NULL; i++) {
    lua_getfield(L, t, fields[i]);
    if (lua_isnil(L, -1)) continue;
    if (lua_type(L, -1) != LUA_TSTRING || strlen(lua_tostring(L, -1)) != lua_rawlen(L, -1) ||
        lua_rawlen(L, -1) == 0)
      luaL_argerror(L, 1, lua_pushfstring(L, "field 'tls.%s' must be a non-empty string", fields[i]));
    *slot[i] = lua_tostring(L, -1);
  }
  lua_getfield(L, t, "verify");
  if (!lua_isnil(L, -1) && !lua_isboolean(L, -1)) luaL_argerror(L, 1, "field 'tls.verify' must be a boolean");
  if (lua_isboolean(L, -1)) o->verify = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if ((o->cert == NULL) != (o->key == NULL))
    luaL_argerror(L, 1, "fields 'tls.cert' and 'tls.key' go together");
  return 1;
}

/* Builds the settings read_tls read, or raises a bad argument that says why. */
static rl_tls *make_tls(lua_State *L, const rl_tls_opts *o) {
  char err[RL_ERRLEN];
  rl_tls *tls = rl_tls_new(o, err, sizeof err);
  if (tls == NULL) luaL_argerror(L, 1, lua_pushfstring(L, "%s", err));
  return tls;
}

/*
 * core.check_tls(opts) -> true. Reads the files of opts.tls (see read_tls) as
 * core.new would, and raises a bad argument when one is missing, unreadable,
 * or when the key does not match the certificate. For the cosocket transport,
 * whose handshake is nginx's: its files are checked the same way.
 */
static int core_check_tls(lua_State *L) {
  rl_tls_opts o;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  if (read_tls(L, &o)) rl_tls_unref(make_tls(L, &o));
  lua_pushboolean(L, 1);
  return 1;
}

/*
 * core.new(opts) -> client. No I/O but reading TLS files. opts: host, port,
 * path, username, password, db, connect_timeout_ms, timeout_ms, prefix, tls
 * (see read_tls); already checked and given defaults by redislock.lua,
 * checked again here for direct callers.
 */
static int core_new(lua_State *L) {
  rl_conn_opts o;
  rl_tls_opts tls;
  int use_tls;
  const char *prefix;
  size_t plen = 0;
  rl_client *c;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  memset(&o, 0, sizeof o);
  /* stack: opts, host, path, username, password, prefix (strings stay alive) */
  o.host = (char *)opt_string(L, "host");
  o.path = (char *)opt_string(L, "path");
  o.username = (char *)opt_string(L, "username");
  o.password = (char *)opt_string(L, "password");
  lua_getfield(L, 1, "prefix"); /* binary-safe: may hold any bytes but braces */
  if (lua_isnil(L, -1)) {
    plen = strlen(prefix = "lock:");
  } else {
    if (lua_type(L, -1) != LUA_TSTRING) luaL_argerror(L, 1, "field 'prefix' must be a string");
    const char *why;
    prefix = lua_tolstring(L, -1, &plen);
    why = rl_check_prefix(prefix, plen);
    if (why != NULL) luaL_argerror(L, 1, lua_pushfstring(L, "field 'prefix' %s", why));
  }
  if (o.host == NULL && o.path == NULL) o.host = "127.0.0.1";
  if (o.username != NULL && o.password == NULL)
    luaL_argerror(L, 1, "field 'username' needs a 'password'");
  o.port = (int)opt_integer(L, "port", 6379, 1, 65535);
  o.db = opt_integer(L, "db", 0, 0, 1000000);
  o.connect_timeout_ms = opt_integer(L, "connect_timeout_ms", 1000, 1, 86400000);
  o.timeout_ms = opt_integer(L, "timeout_ms", 1000, 1, 86400000);
  use_tls = read_tls(L, &tls);
  if (use_tls && o.path != NULL) luaL_argerror(L, 1, "field 'tls' needs a TCP host, not a unix socket 'path'");

  /* Made closed first (as liolib does): an error below cannot leak it. */
  c = (rl_client *)lua_newuserdatauv(L, sizeof *c, 0);
  memset(c, 0, sizeof *c);
  c->conn.fd = c->waiter.fd = -1;
  c->closed = 1;
  luaL_setmetatable(L, CLIENT_MT);
  o.tls = use_tls ? make_tls(L, &tls) : NULL; /* the last check that may raise */
  c->prefix = malloc(plen + 1);
  if (c->prefix == NULL || rl_conn_init(&c->conn, &o) != 0 || rl_conn_init(&c->waiter, &o) != 0) {
    rl_tls_unref(o.tls);
    client_free(c);
    return luaL_error(L, "redislock: out of memory");
  }
  rl_tls_unref(o.tls); /* the connections hold theirs */
  if (plen > 0) memcpy(c->prefix, prefix, plen);
  c->prefix[plen] = '\0';
  c->plen = plen;
  c->closed = 0;
  return 1;
}

/*
 * Checks the arguments of a script starting at idx: op (a name of
 * rl_op_name: "acquire", "release", ... "sem_acquire", "write_leave"), key,
 * token and, for the ops that take one (rl_op_takes_ms), ms (a ttl in whole
 * milliseconds; for fence_up, the fence); for sem_acquire also n (the
 * limit) at nidx. Raises on bad ones; leaves the stack as is.
 */
static rl_op check_script(lua_State *L, int idx, int nidx, const char **key, size_t *klen,
                          const char **token, size_t *tlen, long long *ms, long long *n) {
  static const char *ops[RL_OP_COUNT + 1];
  rl_op op;
  const char *why;
  if (ops[0] == NULL) { /* the same names every time: a race writes the same pointers */
    int i;
    for (i = 0; i < RL_OP_COUNT; i++) ops[i] = rl_op_name((rl_op)i);
  }
  op = (rl_op)luaL_checkoption(L, idx, NULL, ops);
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
                  "limit must be an integer >= 1");
    *n = (long long)v;
  }
  return op;
}

/*
 * client:eval(op, key, token[, ms[, replicas, replica_ms[, n]]]) -> status, value[, acked | nil, err] | nil, err
 * Runs one script. op is "acquire", "release", "extend", "pttl",
 * "acquire_fair", "leave" or "release_one" (a release of the lock's key
 * alone, for a cluster slot half moved), or "take": the first try of an
 * acquire, the acquire script's work without a script (see rl_script.c),
 * followed by the acquire script when the lock is held; or one of the
 * semaphore's and read-write lock's ("sem_acquire" ... "write_leave"). ms is
 * the ttl of the ops that take one; n the limit of sem_acquire. Leaves two values: status 1 (ours), 0 (no such lock) or -1 (another
 * owner's), and the fence (acquire when ours) or milliseconds left; or nil
 * and a "connection: ..." / "redis: ..." message. With replicas, a script
 * that answered 1 is followed by WAIT replicas replica_ms on the same
 * connection, and a third value: how many replicas acknowledged (or nil and
 * why the WAIT failed, the lock being ours all the same).
 */
static int client_eval(lua_State *L) {
  rl_client *c = check_client(L, 1);
  const char *key, *token;
  size_t klen, tlen;
  long long ms;
  long long n;
  rl_op op = check_script(L, 2, 8, &key, &klen, &token, &tlen, &ms, &n);
  char err[RL_ERRLEN];
  rl_cmd cmd;
  rl_result res;
  long long acked = 0;
  lua_Integer replicas = 0, replica_ms = 0;
  int rc, isnum = 0, isnum2 = 0;
  if (!lua_isnoneornil(L, 6)) {
    replicas = lua_tointegerx(L, 6, &isnum);
    replica_ms = lua_tointegerx(L, 7, &isnum2);
    luaL_argcheck(L, lua_type(L, 6) == LUA_TNUMBER && isnum && replicas >= 1 && replicas <= 1000000, 6,
                  "replicas must be an integer >= 1");
    luaL_argcheck(L, lua_type(L, 7) == LUA_TNUMBER && isnum2 && replica_ms >= 1 && replica_ms <= RL_MAX_MS, 7,
                  "replica_ms must be an integer number of milliseconds >= 1");
  }
  if (rl_cmd_init(&cmd, op, c->prefix, c->plen, key, klen, token, tlen, ms, n) != 0)
    return luaL_error(L, "redislock: out of memory");
  arm_asking(c, &c->conn);
  rc = rl_conn_eval(&c->conn, &cmd, &res, err);
  c->conn.asking = 0;
  rl_cmd_free(&cmd);
  if (rc != 0) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  lua_pushinteger(L, res.status);
  lua_pushinteger(L, (lua_Integer)res.value);
  if (replicas == 0 || res.status != RL_HELD) return 2;
  /* The lock is ours now: a failed WAIT is reported beside it, so that the
     caller can give the lock back rather than leave it to its TTL. */
  if (rl_conn_wait_replicas(&c->conn, (long long)replicas, (long long)replica_ms, &acked, err) != 0) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 4;
  }
  lua_pushinteger(L, (lua_Integer)acked);
  return 3;
}

/*
 * client:asking() -> true
 * The next call of eval, command or wait goes to this node after an ASKING
 * (Redis Cluster's ASK redirect: the slot is being moved here), and so does
 * the EVAL after a NOSCRIPT within it.
 */
static int client_asking(lua_State *L) {
  rl_client *c = check_client(L, 1);
  c->asking = 1;
  lua_pushboolean(L, 1);
  return 1;
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
static int push_reply_protected(lua_State *L) {
  const redisReply *r = (const redisReply *)lua_touserdata(L, 1);
  push_reply(L, r, 0);
  return 1;
}

/*
 * Collects the arguments from first to the top of the stack (strings or
 * numbers, at least one) into argv/len, which live in a userdata pushed on
 * the stack (collected even if something later raises). Returns their count.
 */
static int command_args(lua_State *L, int first, const char ***argv, size_t **len) {
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
 * number of values pushed. push_reply_protected must already be at stack
 * index fidx (pushed before r existed: pushing a C function allocates on
 * LuaJIT, and nothing may raise while r is alive).
 */
static int push_command_reply(lua_State *L, redisReply *r, int fidx) {
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
 * client:command(name, ...) -> reply | nil, err
 * One Redis command on the client's connection (for tests, examples and
 * fenced writes). Arguments are strings or numbers. A nil reply is false; an
 * error reply is nil, "redis: <message>".
 */
static int client_command(lua_State *L) {
  rl_client *c = check_client(L, 1);
  const char **argv;
  size_t *len;
  int argc = command_args(L, 2, &argv, &len);
  char err[RL_ERRLEN];
  redisReply *r;
  lua_pushcfunction(L, push_reply_protected);
  arm_asking(c, &c->conn);
  r = rl_conn_command(&c->conn, argc, argv, len, 0, err); /* INCR twice is wrong */
  c->conn.asking = 0;
  if (r == NULL) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  return push_command_reply(L, r, lua_gettop(L));
}

/* An optional op name at idx, one of names (NULL-ended, the first the
   default); the rl_op of that name. */
static rl_op opt_op(lua_State *L, int idx, const char *const names[]) {
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
static void check_wait(lua_State *L, int idx, int opidx, const char *prefix, size_t plen, rl_cmd *cmd,
                       long long *ms) {
  static const char *const waits[] = { "acquire", "sem_acquire", "read_acquire", "write_acquire", NULL };
  size_t klen, tlen = 0;
  const char *key = luaL_checklstring(L, idx, &klen);
  const char *token = lua_isnil(L, idx + 1) ? NULL : luaL_checklstring(L, idx + 1, &tlen);
  const char *why = rl_check_key(key, klen);
  int isnum = 0;
  lua_Integer v = lua_tointegerx(L, idx + 2, &isnum);
  rl_op op = opt_op(L, opidx, waits);
  if (why != NULL) luaL_argerror(L, idx, why);
  luaL_argcheck(L, token == NULL || tlen > 0, idx + 1, "token must not be empty");
  luaL_argcheck(L, lua_type(L, idx + 2) == LUA_TNUMBER && isnum && v >= 1 && v <= RL_MAX_MS, idx + 2,
                "wait must be an integer number of milliseconds >= 1");
  *ms = (long long)v;
  if (rl_wait_init(cmd, op, prefix, plen, key, klen, token, tlen, *ms) != 0)
    luaL_error(L, "redislock: out of memory");
}

/*
 * client:wait(key, token, ms[, op]) -> true | false | nil, err
 * Blocks on the wake-up list of the lock (or of the semaphore or read-write
 * lock op belongs to; the shared one, or a fair waiter's own when token is
 * not nil) for at most ms, on the client's second connection so that the
 * first stays free. true when woken, false when the time ran out.
 */
static int client_wait(lua_State *L) {
  rl_client *c = check_client(L, 1);
  char err[RL_ERRLEN];
  long long ms;
  rl_cmd cmd;
  redisReply *r;
  int type;
  lua_settop(L, 5);
  lua_pushcfunction(L, push_reply_protected); /* at 6, before anything is allocated */
  check_wait(L, 2, 5, c->prefix, c->plen, &cmd, &ms);
  /* The server may take the whole wait before it answers. */
  rl_conn_set_timeout(&c->waiter, ms + c->conn.o.timeout_ms);
  arm_asking(c, &c->waiter);
  r = rl_conn_command(&c->waiter, cmd.argc, cmd.argv, cmd.len, 0, err);
  c->waiter.asking = 0;
  rl_cmd_free(&cmd);
  if (r == NULL) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  if (r->type == REDIS_REPLY_ERROR) return push_command_reply(L, r, 6);
  type = r->type;
  freeReplyObject(r);
  lua_pushboolean(L, type == REDIS_REPLY_ARRAY);
  return 1;
}

typedef struct {
  rl_lease *lease; /* NULL once stopped */
} rl_lease_ud;

/* An optional integer argument >= 0 (milliseconds); def when nil. */
static long long opt_ms(lua_State *L, int idx, const char *what, long long def) {
  int isnum = 0;
  lua_Integer v;
  if (lua_isnoneornil(L, idx)) return def;
  v = lua_tointegerx(L, idx, &isnum);
  if (lua_type(L, idx) != LUA_TNUMBER || !isnum || v < 0 || v > RL_MAX_MS)
    luaL_argerror(L, idx, lua_pushfstring(L, "%s must be an integer number of milliseconds >= 0", what));
  return (long long)v;
}

/*
 * client:lease(key, token, ttl_ms[, max_hold_ms[, sent_ms[, _, _, op]]]) -> lease | nil, err
 * Has the watchdog thread renew the lock key/token to ttl_ms every ttl_ms/3
 * (with op: "extend", the default, or "sem_extend", "read_extend", "write_extend"),
 * on a connection of its own made like the client's, until lease:stop() or
 * the lease is collected; max_hold_ms > 0 ends the renewals that long from
 * now. sent_ms: when the acquire was sent (monotonic ms; default now).
 */
static int client_lease(lua_State *L) {
  rl_client *c = check_client(L, 1);
  size_t klen, tlen;
  const char *key = luaL_checklstring(L, 2, &klen);
  const char *token = luaL_checklstring(L, 3, &tlen);
  const char *why = rl_check_key(key, klen);
  int isnum = 0;
  lua_Integer ttl = lua_tointegerx(L, 4, &isnum);
  long long max_hold = opt_ms(L, 5, "max_hold", 0), sent = opt_ms(L, 6, "sent", rl_now_ms());
  static const char *const extends[] = { "extend", "sem_extend", "read_extend", "write_extend", NULL };
  rl_op op = opt_op(L, 9, extends); /* 7 and 8: the Lua transports' scoped and on_lost */
  char err[RL_ERRLEN];
  rl_lease_ud *ud;
  if (why != NULL) luaL_argerror(L, 2, why);
  luaL_argcheck(L, tlen > 0, 3, "token must not be empty");
  luaL_argcheck(L, lua_type(L, 4) == LUA_TNUMBER && isnum && ttl >= 1 && ttl <= RL_MAX_MS, 4,
                "ttl must be an integer number of milliseconds >= 1");
  /* Made empty first: an error below cannot leak the lease. */
  ud = (rl_lease_ud *)lua_newuserdatauv(L, sizeof *ud, 0);
  ud->lease = NULL;
  luaL_setmetatable(L, LEASE_MT);
  ud->lease = rl_lease_start(&c->conn.o, op, c->prefix, c->plen, key, klen, token, tlen, (long long)ttl,
                             max_hold, sent, err);
  if (ud->lease == NULL) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  return 1;
}

/*
 * lease:state() -> "held" | "ended" | "lost", why
 * What the watchdog knows: "ended" once max_hold stopped the renewals; "lost"
 * with a sentence fragment when a renewal found the lock gone or taken, or
 * could not reach the server within the TTL. A stopped lease says "ended".
 */
static int lease_state(lua_State *L) {
  rl_lease_ud *ud = (rl_lease_ud *)luaL_checkudata(L, 1, LEASE_MT);
  char why[RL_ERRLEN];
  rl_lease_state s = ud->lease == NULL ? RL_LEASE_ENDED : rl_lease_state_of(ud->lease, why, sizeof why);
  lua_pushstring(L, s == RL_LEASE_HELD ? "held" : s == RL_LEASE_LOST ? "lost" : "ended");
  if (s != RL_LEASE_LOST) return 1;
  lua_pushstring(L, why);
  return 2;
}

/* lease:extended(ttl_ms[, sent_ms]): the owner extended the lock with a
   command sent at sent_ms (default now); renew to ttl_ms from then on. */
static int lease_extended(lua_State *L) {
  rl_lease_ud *ud = (rl_lease_ud *)luaL_checkudata(L, 1, LEASE_MT);
  int isnum = 0;
  lua_Integer ttl = lua_tointegerx(L, 2, &isnum);
  long long sent = opt_ms(L, 3, "sent", rl_now_ms());
  luaL_argcheck(L, lua_type(L, 2) == LUA_TNUMBER && isnum && ttl >= 1 && ttl <= RL_MAX_MS, 2,
                "ttl must be an integer number of milliseconds >= 1");
  if (ud->lease != NULL) rl_lease_extended(ud->lease, (long long)ttl, sent);
  return 0;
}

/* lease:expires() -> seconds on core.now()'s clock by which the lock expires
   unless renewed again (from the last confirmed renewal); nil once stopped. */
static int lease_expires(lua_State *L) {
  rl_lease_ud *ud = (rl_lease_ud *)luaL_checkudata(L, 1, LEASE_MT);
  if (ud->lease == NULL) return 0;
  lua_pushnumber(L, (lua_Number)rl_lease_expires(ud->lease) / 1000.0);
  return 1;
}

/* lease:stop() -> what expires() said (nothing once stopped); also __gc: no more renewals. Idempotent; no I/O. */
static int lease_stop(lua_State *L) {
  rl_lease_ud *ud = (rl_lease_ud *)luaL_checkudata(L, 1, LEASE_MT);
  if (ud->lease == NULL) return 0;
  /* What expires() would have said, in the same call: release needs both. */
  lua_pushnumber(L, (lua_Number)rl_lease_expires(ud->lease) / 1000.0);
  rl_lease_stop(ud->lease);
  ud->lease = NULL;
  return 1;
}

/* __gc of the per-state sentinel: the last Lua state out stops the thread. */
static int watchdog_leave(lua_State *L) {
  (void)L;
  rl_watchdog_leave();
  return 0;
}

/* client:closed() -> true once the client was closed. */
static int client_closed(lua_State *L) {
  lua_pushboolean(L, ((rl_client *)luaL_checkudata(L, 1, CLIENT_MT))->closed);
  return 1;
}

/* client:close(): closes the connection for good; later calls raise. */
static int client_close(lua_State *L) {
  client_free((rl_client *)luaL_checkudata(L, 1, CLIENT_MT));
  return 0;
}

/* __tostring: "redislock.Client (127.0.0.1:6379)", "... (127.0.0.1:6380, TLS)" or "redislock.Client (closed)". */
static int client_tostring(lua_State *L) {
  rl_client *c = (rl_client *)luaL_checkudata(L, 1, CLIENT_MT);
  char where[160];
  if (c->closed) {
    lua_pushstring(L, "redislock.Client (closed)");
  } else {
    rl_conn_describe(&c->conn, where, sizeof where);
    lua_pushfstring(L, "redislock.Client (%s%s)", where, c->conn.o.tls != NULL ? ", TLS" : "");
  }
  return 1;
}

/*
 * The wire functions below do no I/O: the OpenResty transport
 * (lua/redislock/ngx.lua) sends the bytes they make over cosockets and feeds
 * what it reads into a Reader, so the lock protocol stays in this core.
 */

/* A command's arguments, to be formatted under lua_pcall. */
typedef struct {
  int argc;
  const char **argv;
  const size_t *len;
  const rl_cmd *cmd; /* or a lock command (rl_cmd_bytes), instead of argv */
  char *bytes; /* set by format_protected; the caller frees it when not stack */
  char stack[1024];
} rl_fmt;

/* Protected: pushes the RESP bytes of f's command; f->bytes is freed by the
   caller whether this returns or raises. */
static int format_protected(lua_State *L) {
  rl_fmt *f = (rl_fmt *)lua_touserdata(L, 1);
  long long n = f->cmd != NULL ? rl_cmd_bytes(f->cmd, f->stack, sizeof f->stack, &f->bytes)
                               : rl_format(f->stack, sizeof f->stack, &f->bytes, f->argc, f->argv, f->len);
  if (n < 0) return luaL_error(L, "redislock: out of memory");
  lua_pushlstring(L, f->bytes, (size_t)n);
  return 1;
}

/*
 * Pushes the RESP bytes of a command. Nothing allocated outside Lua outlives
 * a raise; the caller's own buffers (an rl_cmd) must be freed by the caller
 * after this returns: so it returns the lua_pcall status instead of raising,
 * with the error on the stack.
 */
static int push_formatted(lua_State *L, int argc, const char **argv, const size_t *len,
                          const rl_cmd *cmd) {
  rl_fmt f;
  int status;
  f.argc = argc;
  f.argv = argv;
  f.len = len;
  f.cmd = cmd;
  f.bytes = NULL;
  lua_pushcfunction(L, format_protected); /* LuaJIT allocates here: may raise */
  lua_pushlightuserdata(L, &f);
  status = lua_pcall(L, 1, 1, 0);
  if (f.bytes != NULL && f.bytes != f.stack) free(f.bytes);
  return status;
}

/*
 * core.encode_script(op, key, token, ms, prefix[, eval[, n[, claim[, named]]]]) -> bytes
 * The bytes of one lock script command, as client:eval would send it:
 * EVALSHA, or EVAL with the script text when eval is true (after NOSCRIPT).
 * ms is ignored (may be nil) for release and pttl; n is sem_acquire's
 * limit. A take is MULTI, SET, INCR, GET of the era record, EXEC, as a
 * client's acquire sends it; with named, CLIENT GETNAME before EXEC (a
 * pooled connection's name vouches for the record: read its replies with
 * reader:take_reply); with eval, the acquire script it falls back on.
 * claim: an acquire's master ID after a take that answered 2
 * (rl_cmd_claim).
 */
static int core_encode_script(lua_State *L) {
  const char *key, *token, *prefix, *why, *claim;
  size_t klen, tlen, plen;
  long long ms, n;
  rl_op op = check_script(L, 1, 7, &key, &klen, &token, &tlen, &ms, &n);
  rl_cmd cmd;
  int status;
  prefix = luaL_checklstring(L, 5, &plen);
  why = rl_check_prefix(prefix, plen);
  if (why != NULL) luaL_argerror(L, 5, lua_pushfstring(L, "prefix %s", why));
  claim = luaL_optstring(L, 8, NULL); /* before rl_cmd_init: nothing to free when it raises */
  if (rl_cmd_init(&cmd, op, prefix, plen, key, klen, token, tlen, ms, n) != 0)
    return luaL_error(L, "redislock: out of memory");
  cmd.ask_name = lua_toboolean(L, 9);
  if (cmd.ask_name && op != RL_OP_TAKE) {
    rl_cmd_free(&cmd);
    return luaL_argerror(L, 9, "only a take asks the connection's name");
  }
  if (claim != NULL && rl_cmd_claim(&cmd, claim) != 0) {
    rl_cmd_free(&cmd);
    return luaL_argerror(L, 8, "a claim is a master ID (40 hex digits), for an acquire");
  }
  if (lua_toboolean(L, 6)) rl_cmd_use_eval(&cmd);
  status = push_formatted(L, 0, NULL, NULL, &cmd);
  rl_cmd_free(&cmd);
  if (status != 0) return lua_error(L);
  return 1;
}

/*
 * core.encode_wait(key, token, ms, prefix[, op]) -> bytes
 * The BLPOP client:wait sends (token nil: the shared list; op: as client:wait's).
 */
static int core_encode_wait(lua_State *L) {
  size_t plen;
  const char *prefix = luaL_checklstring(L, 4, &plen);
  const char *why = rl_check_prefix(prefix, plen);
  long long ms;
  rl_cmd cmd;
  int status;
  if (why != NULL) luaL_argerror(L, 4, lua_pushfstring(L, "prefix %s", why));
  check_wait(L, 1, 5, prefix, plen, &cmd, &ms);
  status = push_formatted(L, cmd.argc, cmd.argv, cmd.len, NULL);
  rl_cmd_free(&cmd);
  if (status != 0) return lua_error(L);
  return 1;
}

/* core.encode(name, ...) -> bytes of one command; arguments are strings or numbers. */
static int core_encode(lua_State *L) {
  const char **argv;
  size_t *len;
  int argc = command_args(L, 1, &argv, &len);
  if (push_formatted(L, argc, argv, len, NULL) != 0) return lua_error(L);
  return 1;
}

typedef struct {
  redisReader *reader; /* NULL once freed */
  redisReply *take[RL_TAKE_REPLIES]; /* the replies to a take read so far (take_reply) */
  int took;
} rl_reader;

/* Frees the replies to a take that rd kept. */
static void reader_drop_take(rl_reader *rd) {
  for (int i = 0; i < rd->took; i++) freeReplyObject(rd->take[i]);
  rd->took = 0;
}

/* The reader at 1, refusing other values and closed readers. */
static rl_reader *check_reader(lua_State *L) {
  rl_reader *rd = (rl_reader *)luaL_checkudata(L, 1, READER_MT);
  if (rd->reader == NULL) luaL_argerror(L, 1, "reader is closed");
  return rd;
}

/* core.reader() -> a Reader: feed it bytes, take complete replies out. */
static int core_reader(lua_State *L) {
  rl_reader *rd = (rl_reader *)lua_newuserdatauv(L, sizeof *rd, 0);
  rd->reader = NULL;
  rd->took = 0;
  luaL_setmetatable(L, READER_MT);
  rd->reader = redisReaderCreate();
  if (rd->reader == NULL) return luaL_error(L, "redislock: out of memory");
  return 1;
}

/* reader:feed(bytes): appends bytes read from the server. */
static int reader_feed(lua_State *L) {
  rl_reader *rd = check_reader(L);
  size_t len;
  const char *bytes = luaL_checklstring(L, 2, &len);
  if (rd->reader->err) /* reply() already said why; feeding on is a misuse */
    return luaL_error(L, "redislock: the reader failed (%s)", rd->reader->errstr);
  if (redisReaderFeed(rd->reader, bytes, len) != REDIS_OK)
    return luaL_error(L, "redislock: out of memory");
  return 0;
}

/*
 * Takes the next complete reply out of the reader into *r (NULL when more
 * bytes are needed). Returns 0, or -1 with a message in err when the bytes
 * cannot be read (not RESP, or nested too deep; see rl_read_error): the
 * reader, and the connection it reads, are unusable then.
 */
static int reader_next(rl_reader *rd, redisReply **r, char err[RL_ERRLEN]) {
  void *reply = NULL;
  *r = NULL;
  if (redisReaderGetReply(rd->reader, &reply) != REDIS_OK) {
    rl_read_error(rd->reader->err, rd->reader->errstr, NULL, err, RL_ERRLEN);
    return -1;
  }
  *r = (redisReply *)reply;
  return 0;
}

/*
 * reader:reply() -> value | nil, err | nil, err, true | nil
 * The next reply to a plain command, as client:command returns it; nothing
 * but nil (no message) when more bytes are needed; a third value, true, when
 * the bytes cannot be read (the connection must be closed).
 */
static int reader_reply(lua_State *L) {
  rl_reader *rd = check_reader(L);
  char err[RL_ERRLEN];
  redisReply *r;
  lua_settop(L, 1);
  lua_pushcfunction(L, push_reply_protected); /* at 2, before the reply exists */
  if (reader_next(rd, &r, err) != 0) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    lua_pushboolean(L, 1);
    return 3;
  }
  if (r == NULL) {
    lua_pushnil(L);
    return 1;
  }
  return push_command_reply(L, r, 2);
}

/*
 * reader:script_reply() -> status, value | false, err | nil, err[, true] | nil
 * The next reply to a lock script, as client:eval returns it; false and the
 * server's message for NOSCRIPT (resend with EVAL); nil alone when more
 * bytes are needed; a third value, true, when the bytes cannot be read (the
 * connection must be closed).
 */
static int reader_script_reply(lua_State *L) {
  rl_reader *rd = check_reader(L);
  char err[RL_ERRLEN], msg[RL_ERRLEN - 8];
  redisReply *r;
  rl_result res;
  rl_decoded d;
  if (reader_next(rd, &r, err) != 0) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    lua_pushboolean(L, 1);
    return 3;
  }
  if (r == NULL) {
    lua_pushnil(L);
    return 1;
  }
  d = rl_decode(r, &res, msg, sizeof msg);
  freeReplyObject(r);
  if (d == RL_DECODED) {
    lua_pushinteger(L, res.status);
    lua_pushinteger(L, (lua_Integer)res.value);
    return 2;
  }
  if (d == RL_NOSCRIPT) lua_pushboolean(L, 0);
  else lua_pushnil(L);
  lua_pushfstring(L, "redis: %s", d == RL_NOSCRIPT ? "NOSCRIPT" : msg);
  return 2;
}

/*
 * reader:take_reply() -> status, value | nil, err[, true] | nil
 * The replies to a take that asks the connection's name
 * (core.encode_script("take", ..., named)): 1 and the
 * fence; 2 and the master ID the era record names ("" for none) when the
 * lock was taken but the fence's era is for the acquire script to check
 * (rl_proto.h, RL_UNVERIFIED); -1 and -3 when the lock is held (its TTL
 * unknown: the acquire script follows); nil and "redis: ..." for an error
 * reply; nil alone when more bytes are needed (the replies read so far are
 * kept for the next call); a third value, true, when the bytes cannot be
 * read.
 */
static int reader_take_reply(lua_State *L) {
  rl_reader *rd = check_reader(L);
  char err[RL_ERRLEN], msg[RL_ERRLEN - 8];
  rl_result res;
  rl_decoded d;
  while (rd->took < RL_TAKE_REPLIES) {
    redisReply *r;
    if (reader_next(rd, &r, err) != 0) {
      reader_drop_take(rd);
      lua_pushnil(L);
      lua_pushstring(L, err);
      lua_pushboolean(L, 1);
      return 3;
    }
    if (r == NULL) {
      lua_pushnil(L);
      return 1;
    }
    rd->take[rd->took++] = r;
  }
  d = rl_decode_take(rd->take, RL_TAKE_REPLIES, &res, msg, sizeof msg);
  reader_drop_take(rd);
  if (d != RL_DECODED) {
    lua_pushnil(L);
    lua_pushfstring(L, "redis: %s", msg);
    return 2;
  }
  lua_pushinteger(L, res.status);
  if (res.status == RL_UNVERIFIED) lua_pushstring(L, res.era);
  else lua_pushinteger(L, (lua_Integer)res.value);
  return 2;
}

/* __tostring: "redislock.Reader" or "redislock.Reader (closed)". */
static int reader_tostring(lua_State *L) {
  rl_reader *rd = (rl_reader *)luaL_checkudata(L, 1, READER_MT);
  lua_pushstring(L, rd->reader == NULL ? "redislock.Reader (closed)" : "redislock.Reader");
  return 1;
}

/* __gc, __close and reader:close(): frees the reader and what it buffered. Idempotent. */
static int reader_close(lua_State *L) {
  rl_reader *rd = (rl_reader *)luaL_checkudata(L, 1, READER_MT);
  if (rd->reader != NULL) redisReaderFree(rd->reader);
  rd->reader = NULL;
  reader_drop_take(rd);
  return 0;
}

/* core.token([suffix]) -> 32 hex digits (128 bits) from the OS random
   source, then suffix (who holds it: one string made in one step). */
static int core_token(lua_State *L) {
  char tok[RL_TOKEN_HEX + 1];
  size_t slen = 0;
  const char *suffix = luaL_optlstring(L, 1, "", &slen);
  luaL_Buffer b;
  if (rl_token(tok) != 0)
    return luaL_error(L, "redislock: cannot read the OS random source (%s)", strerror(errno));
  if (slen == 0) {
    lua_pushlstring(L, tok, RL_TOKEN_HEX);
    return 1;
  }
  luaL_buffinit(L, &b);
  luaL_addlstring(&b, tok, RL_TOKEN_HEX);
  luaL_addlstring(&b, suffix, slen);
  luaL_pushresult(&b);
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

/*
 * core.eval_many(timeout_ms, op, key, token, ms, client, ...) -> statuses, values
 * Runs one lock script (op as client:eval takes it, but not "take") on every
 * client's connection at once (rl_conn_eval_many): all are sent, then all
 * replies read as they come within timeout_ms. statuses[i] is the status
 * (1, 0, -1) and values[i] the value for the i-th client, or statuses[i]
 * false and values[i] the "connection: ..." / "redis: ..." message.
 */
static int core_eval_many(lua_State *L) {
  int isnum = 0, n = lua_gettop(L) - 5, i;
  lua_Integer timeout = lua_tointegerx(L, 1, &isnum);
  const char *key, *token;
  size_t klen, tlen;
  long long ms, nlimit;
  rl_op op;
  rl_conn *conns[RL_MANY_MAX];
  rl_cmd *cmds;
  rl_result *out;
  int *rc;
  char (*err)[RL_ERRLEN];
  luaL_argcheck(L, lua_type(L, 1) == LUA_TNUMBER && isnum && timeout >= 1 && timeout <= RL_MAX_MS, 1,
                "timeout must be an integer number of milliseconds >= 1");
  op = check_script(L, 2, 0, &key, &klen, &token, &tlen, &ms, &nlimit);
  luaL_argcheck(L, op != RL_OP_TAKE, 2, "a take runs on one connection only");
  luaL_argcheck(L, n >= 1 && n <= RL_MANY_MAX, 6, "1 to 64 clients expected");
  for (i = 0; i < n; i++) conns[i] = &check_client(L, 6 + i)->conn;
  /* One block for the commands and answers, freed by Lua (no leak if a later step raises). */
  cmds = (rl_cmd *)lua_newuserdatauv(L, (sizeof *cmds + sizeof *out + sizeof *rc + sizeof *err) * (size_t)n, 0);
  out = (rl_result *)(cmds + n);
  rc = (int *)(out + n);
  err = (char (*)[RL_ERRLEN])(rc + n);
  for (i = 0; i < n; i++) {
    rl_client *c = check_client(L, 6 + i);
    if (rl_cmd_init(&cmds[i], op, c->prefix, c->plen, key, klen, token, tlen, ms, nlimit) != 0) {
      while (--i >= 0) rl_cmd_free(&cmds[i]);
      return luaL_error(L, "redislock: out of memory");
    }
  }
  {
    rl_cmd *ptrs[RL_MANY_MAX];
    for (i = 0; i < n; i++) ptrs[i] = &cmds[i];
    rl_conn_eval_many(conns, ptrs, n, (long long)timeout, out, rc, err);
  }
  for (i = 0; i < n; i++) rl_cmd_free(&cmds[i]);
  lua_createtable(L, n, 0);
  lua_createtable(L, n, 0);
  for (i = 0; i < n; i++) {
    if (rc[i] == 0) {
      lua_pushinteger(L, out[i].status);
      lua_rawseti(L, -3, i + 1);
      lua_pushinteger(L, (lua_Integer)out[i].value);
    } else {
      lua_pushboolean(L, 0);
      lua_rawseti(L, -3, i + 1);
      lua_pushstring(L, err[i]);
    }
    lua_rawseti(L, -2, i + 1);
  }
  return 2;
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

/* core.era_tag(slot) -> the tag of the slot's era record (rl_era_tag):
   the record is "<prefix>{<tag>}:era". */
static int core_era_tag(lua_State *L) {
  lua_Integer slot = luaL_checkinteger(L, 1);
  luaL_argcheck(L, slot >= 0 && slot < RL_SLOTS, 1, "slot must be in 0..16383");
  lua_pushstring(L, rl_era_tag((int)slot));
  return 1;
}

/* core.setname(era) -> the bytes of CLIENT SETNAME naming a connection
   after the master ID era (a take's, status 2): sent before the acquire
   script that checks it (rl_script.c, "Fences across failovers"). */
static int core_setname(lua_State *L) {
  size_t len;
  const char *era = luaL_checklstring(L, 1, &len);
  char buf[RL_SETNAME_BYTES];
  luaL_argcheck(L, len == RL_REPLID_LEN, 1, "a master ID is 40 hex digits");
  lua_pushlstring(L, buf, rl_setname_bytes(era, buf));
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

/* core.now() -> seconds on the monotonic clock (shared by all processes). */
static int core_now(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec / 1e9);
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

/*
 * client:retarget(host, port) -> true
 * Points the client's connections at another TCP host and port (the master
 * Sentinel named): they are closed, and the next call connects there. The
 * client's leases stay where they are (core.move_leases moves them).
 */
static int client_retarget(lua_State *L) {
  rl_client *c = check_client(L, 1);
  const char *host = luaL_checkstring(L, 2);
  lua_Integer port = luaL_checkinteger(L, 3);
  luaL_argcheck(L, strlen(host) == lua_rawlen(L, 2) && host[0] != '\0', 2,
                "host must be a non-empty string without NUL");
  luaL_argcheck(L, port >= 1 && port <= 65535, 3, "port must be in 1..65535");
  luaL_argcheck(L, c->conn.o.path == NULL, 1, "a client on a unix socket cannot move to a TCP host");
  if (rl_conn_retarget(&c->conn, host, (int)port) != 0 || rl_conn_retarget(&c->waiter, host, (int)port) != 0)
    return luaL_error(L, "redislock: out of memory");
  lua_pushboolean(L, 1);
  return 1;
}

/*
 * client:usable() -> boolean
 * Whether the client's connection is open and fit for the next command
 * (see rl_conn_usable): false means the next call connects afresh, which a
 * client behind Sentinel does only after asking the sentinels again.
 */
static int client_usable(lua_State *L) {
  lua_pushboolean(L, rl_conn_usable(&check_client(L, 1)->conn));
  return 1;
}

/*
 * core.move_leases(from_host, from_port, to_host, to_port) -> moved
 * A master moved: the watchdog renews the locks it renewed on from_host:
 * from_port on to_host:to_port from now on, at once.
 */
static int core_move_leases(lua_State *L) {
  const char *from = luaL_checkstring(L, 1), *to = luaL_checkstring(L, 3);
  lua_Integer from_port = luaL_checkinteger(L, 2), to_port = luaL_checkinteger(L, 4);
  int moved;
  luaL_argcheck(L, from_port >= 1 && from_port <= 65535, 2, "port must be in 1..65535");
  luaL_argcheck(L, to_port >= 1 && to_port <= 65535, 4, "port must be in 1..65535");
  moved = rl_watchdog_move(from, (int)from_port, to, (int)to_port);
  if (moved < 0) return luaL_error(L, "redislock: out of memory");
  lua_pushinteger(L, moved);
  return 1;
}

typedef struct {
  rl_sentinel_watch *w; /* NULL once stopped */
} rl_watch_ud;

/*
 * core.sentinel_watch(master, client, ...) -> watch
 * Starts a thread that stays subscribed to +switch-master on one of the
 * sentinels the clients (core.new) connect to, the next one when it fails
 * (see rl_sentinel.h). watch:count() grows with every switch of master heard
 * and every subscription lost or made; watch:close() (also __gc) stops it.
 */
static int core_sentinel_watch(lua_State *L) {
  const char *master = luaL_checkstring(L, 1);
  int n = lua_gettop(L) - 1, i;
  rl_conn_opts *opts;
  rl_watch_ud *ud;
  char err[RL_ERRLEN];
  luaL_argcheck(L, n >= 1, 2, "a sentinel client expected");
  for (i = 0; i < n; i++) check_client(L, 2 + i);
  ud = (rl_watch_ud *)lua_newuserdatauv(L, sizeof *ud, 0);
  ud->w = NULL;
  luaL_setmetatable(L, WATCH_MT);
  opts = (rl_conn_opts *)lua_newuserdatauv(L, sizeof *opts * (size_t)n, 0); /* freed by Lua */
  for (i = 0; i < n; i++) opts[i] = check_client(L, 2 + i)->conn.o;
  ud->w = rl_sentinel_watch_start(opts, n, master, err); /* copies opts */
  if (ud->w == NULL) return luaL_error(L, "redislock: %s", err);
  lua_pop(L, 1);
  return 1;
}

static rl_watch_ud *check_watch(lua_State *L) {
  rl_watch_ud *ud = (rl_watch_ud *)luaL_checkudata(L, 1, WATCH_MT);
  if (ud->w == NULL) luaL_argerror(L, 1, "watch is closed");
  return ud;
}

/* watch:count() -> integer */
static int watch_count(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)rl_sentinel_watch_count(check_watch(L)->w));
  return 1;
}

/* watch:close(), __gc: stops the thread. Idempotent. */
static int watch_close(lua_State *L) {
  rl_watch_ud *ud = (rl_watch_ud *)luaL_checkudata(L, 1, WATCH_MT);
  if (ud->w != NULL) rl_sentinel_watch_stop(ud->w);
  ud->w = NULL;
  return 0;
}

/* Pushes { acquire = { sha = ..., text = ... }, ... } for specs and tools. */
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
    lua_setfield(L, -2, rl_op_name((rl_op)op));
  }
  {
    const char *name, *sha, *text;
    int i;
    for (i = 0; (text = rl_extra_script(i, &name, &sha)) != NULL; i++) {
      lua_createtable(L, 0, 2);
      lua_pushstring(L, sha);
      lua_setfield(L, -2, "sha");
      lua_pushstring(L, text);
      lua_setfield(L, -2, "text");
      lua_setfield(L, -2, name);
    }
  }
}

/* Pushes { release = true, ... }: the ops never sent twice (rl_op_resendable),
   for the cosocket transport, which resends as the C one does. */
static void push_once_only(lua_State *L) {
  int op;
  lua_newtable(L);
  for (op = 0; op < RL_OP_COUNT; op++) {
    if (rl_op_resendable((rl_op)op)) continue;
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, rl_op_name((rl_op)op));
  }
}

static const luaL_Reg client_methods[] = {
  { "eval", client_eval },
  { "command", client_command },
  { "wait", client_wait },
  { "lease", client_lease },
  { "close", client_close },
  { "closed", client_closed },
  { "retarget", client_retarget },
  { "usable", client_usable },
  { "asking", client_asking },
  { NULL, NULL }
};

static const luaL_Reg watch_methods[] = {
  { "count", watch_count },
  { "close", watch_close },
  { NULL, NULL }
};

static const luaL_Reg lease_methods[] = {
  { "state", lease_state },
  { "extended", lease_extended },
  { "expires", lease_expires },
  { "stop", lease_stop },
  { NULL, NULL }
};

static const luaL_Reg reader_methods[] = {
  { "feed", reader_feed },
  { "reply", reader_reply },
  { "script_reply", reader_script_reply },
  { "take_reply", reader_take_reply },
  { "close", reader_close },
  { NULL, NULL }
};

static const luaL_Reg core_functions[] = {
  { "new", core_new },
  { "check_tls", core_check_tls },
  { "encode_script", core_encode_script },
  { "encode", core_encode },
  { "encode_wait", core_encode_wait },
  { "reader", core_reader },
  { "token", core_token },
  { "fork_gen", core_fork_gen },
  { "ms", core_ms },
  { "key_problem", core_key_problem },
  { "prefix_problem", core_prefix_problem },
  { "eval_many", core_eval_many },
  { "slot", core_slot },
  { "lock_slot", core_lock_slot },
  { "guard_script", core_guard_script },
  { "era_tag", core_era_tag },
  { "setname", core_setname },
  { "redirect", core_redirect },
  { "now", core_now },
  { "sleep", core_sleep },
  { "move_leases", core_move_leases },
  { "sentinel_watch", core_sentinel_watch },
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
  if (luaL_newmetatable(L, CLIENT_MT)) {
    luaL_newlib(L, client_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, client_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, client_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, client_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, LEASE_MT)) {
    luaL_newlib(L, lease_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, lease_stop);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  keep_loaded();
  /* A sentinel that lives as long as this Lua state: its __gc runs when the
     state closes (before the module is unloaded: it was made after the
     package library's table of loaded C libraries). */
  lua_newuserdatauv(L, 1, 0);
  if (luaL_newmetatable(L, WATCHDOG_MT)) {
    lua_pushcfunction(L, watchdog_leave);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  rl_watchdog_enter(); /* after the allocations: the __gc above is now certain to run */
  luaL_ref(L, LUA_REGISTRYINDEX);
  if (luaL_newmetatable(L, WATCH_MT)) {
    luaL_newlib(L, watch_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, watch_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, watch_close);
    lua_setfield(L, -2, "__close");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, READER_MT)) {
    luaL_newlib(L, reader_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, reader_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, reader_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, reader_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  luaL_newlib(L, core_functions);
  rl_proc_register(L);
  lua_pushliteral(L, RL_VERSION);
  lua_setfield(L, -2, "_VERSION");
  lua_pushinteger(L, RL_MAX_MS);
  lua_setfield(L, -2, "MAX_MS");
  push_scripts(L);
  lua_setfield(L, -2, "scripts");
  push_once_only(L);
  lua_setfield(L, -2, "once_only");
  return 1;
}
