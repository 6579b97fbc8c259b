/* SPDX-License-Identifier: MIT */
/* The Client type of redislock.core (core.new): the blocking transport's
   connections, a lock script or command per call, waits; core.eval_many. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rl_lua.h"
#include "rl_watchdog.h"

/* Arms conn for one method call with the ASKING client:asking() asked for. */
static void arm_asking(rl_client *c, rl_conn *conn) {
  conn->asking = c->asking;
  c->asking = 0;
}

/* The client at idx, refusing other values and closed clients. */
rl_client *rl_lua_check_client(lua_State *L, int idx) {
  rl_client *c = (rl_client *)luaL_checkudata(L, idx, RL_CLIENT_MT);
  if (c->closed) luaL_argerror(L, idx, "client is closed");
  return c;
}

/* rl_lua_check_client(L, 1) for a method (rl_lua_newtype: the metatable is
   its upvalue 1), the usual case found without the registry. */
static rl_client *check_self(lua_State *L) {
  rl_client *c = (rl_client *)lua_touserdata(L, 1);
  if (c != NULL && lua_getmetatable(L, 1)) {
    int same = lua_rawequal(L, -1, lua_upvalueindex(1));
    lua_pop(L, 1);
    if (same && !c->closed) return c;
  }
  return rl_lua_check_client(L, 1);
}

/* Releases everything the client owns. Idempotent: __gc, __close and close(). */
static void client_free(rl_client *c) {
  rl_conn_free(&c->conn);
  rl_conn_free(&c->waiter);
  free(c->prefix);
  free(c->tokens.buf);
  c->prefix = NULL;
  rl_tokens_init(&c->tokens, NULL, NULL, 0, NULL, 0);
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
 * checked again here for direct callers; and master_only (behind Sentinel:
 * a call that finds its connection closed by the server fails, its
 * message ending "(nothing was sent)", rather than connect afresh).
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
  luaL_setmetatable(L, RL_CLIENT_MT);
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
  /* Behind Sentinel (redislock/sentinel.lua): the sentinels are asked
     before a connection the server closed is replaced. */
  lua_getfield(L, 1, "master_only");
  c->conn.ask_first = c->waiter.ask_first = lua_toboolean(L, -1);
  lua_pop(L, 1);
  c->closed = 0;
  return 1;
}

/*
 * Runs the lock op on key with token (and ms, n: see rl_cmd_init) on the
 * client's connection, with the WAIT call->replicas and call->replica_ms
 * ask for: 0 with the result in call->out, or -1 with call->err. Raises
 * only when out of memory, before anything is sent.
 */
static int run(lua_State *L, rl_client *c, rl_call *call, rl_op op, const char *key, size_t klen,
               const char *token, size_t tlen, long long ms, long long n) {
  rl_cmd cmd;
  long long replicas = call->replicas, replica_ms = call->replica_ms;
  int rc;
  if (rl_cmd_init(&cmd, op, c->prefix, c->plen, key, klen, token, tlen, ms, n) != 0)
    return luaL_error(L, "redislock: out of memory");
  rl_call_init(call, &cmd);
  call->asking = c->asking;
  c->asking = 0;
  call->replicas = replicas;
  call->replica_ms = replica_ms;
  rc = rl_conn_call(&c->conn, call);
  rl_call_free(call);
  rl_cmd_free(&cmd);
  return rc;
}

/*
 * client:eval(op, key, token[, ms[, more]]) -> status, value[, acked | nil, err] | nil, err[, left]
 * Runs one script. op is "acquire", "release", "extend", "pttl",
 * "acquire_wait", "acquire_fair", "leave" or "release_one" (a release of the lock's key
 * alone, for a cluster slot half moved), or "take": the first try of an
 * acquire, a transaction without a script (see csrc/scripts/README.md),
 * followed by the acquire script when the lock is held; or one of the
 * semaphore's and read-write lock's ("sem_acquire" ... "write_leave"). ms is
 * the ttl of the ops that take one; more a table of what else: n (the limit
 * of sem_acquire; the TTL a handoff gives, in ms, of acquire_wait and
 * acquire_fair), replicas and replica_ms. Leaves two values: status 1
 * (ours), 0 (no such lock) or -1 (another owner's), and the fence (acquire
 * when ours) or milliseconds left; or nil and a "connection: ..." /
 * "redis: ..." message, and a third value when a take's call says what
 * is left of the lock it took: "nothing" (it gave it back) or "staying"
 * (it could not). With more.replicas, a script that answered 1 is
 * followed by WAIT replicas replica_ms on the same connection, and a third
 * value: how many replicas acknowledged (or nil and why the WAIT failed,
 * the lock being ours all the same).
 */
static int client_eval(lua_State *L) {
  rl_client *c = check_self(L);
  const char *key, *token;
  size_t klen, tlen;
  long long ms, n;
  rl_op op;
  rl_call call;
  lua_Integer replicas = 0, replica_ms = 0;
  int isnum = 0, isnum2 = 0;
  static const char *const more[] = { "n", "replicas", "replica_ms", NULL };
  rl_lua_push_fields(L, 6, more); /* at 7, 8 and 9, where the checks below name them */
  op = rl_lua_check_script(L, 2, 7, &key, &klen, &token, &tlen, &ms, &n);
  if (!lua_isnil(L, 8)) {
    replicas = lua_tointegerx(L, 8, &isnum);
    replica_ms = lua_tointegerx(L, 9, &isnum2);
    luaL_argcheck(L, lua_type(L, 8) == LUA_TNUMBER && isnum && replicas >= 1 && replicas <= 1000000, 6,
                  "replicas must be an integer >= 1");
    luaL_argcheck(L, lua_type(L, 9) == LUA_TNUMBER && isnum2 && replica_ms >= 1 && replica_ms <= RL_MAX_MS, 6,
                  "replica_ms must be an integer number of milliseconds >= 1");
  }
  call.replicas = replicas;
  call.replica_ms = replica_ms;
  if (run(L, c, &call, op, key, klen, token, tlen, ms, n) != 0) return rl_lua_push_failed(L, &call);
  lua_pushinteger(L, call.out.status);
  lua_pushinteger(L, (lua_Integer)call.out.value);
  if (replicas == 0 || call.out.status != RL_HELD) return 2;
  /* The lock is ours now: a failed WAIT is reported beside it, so that the
     caller can give the lock back rather than leave it to its TTL. */
  if (call.wait_err[0] != '\0') {
    lua_pushnil(L);
    lua_pushstring(L, call.wait_err);
    return 4;
  }
  lua_pushinteger(L, (lua_Integer)call.acked);
  return 3;
}

/*
 * client:asking() -> true
 * The next call of eval, command or wait goes to this node after an ASKING
 * (Redis Cluster's ASK redirect: the slot is being moved here), and so does
 * the EVAL after a NOSCRIPT within it.
 */
static int client_asking(lua_State *L) {
  rl_client *c = rl_lua_check_client(L, 1);
  c->asking = 1;
  lua_pushboolean(L, 1);
  return 1;
}

/*
 * client:command(name, ...) -> reply | nil, err
 * One Redis command on the client's connection (for tests, examples and
 * fenced writes). Arguments are strings or numbers. A nil reply is false; an
 * error reply is nil, "redis: <message>".
 */
static int client_command(lua_State *L) {
  rl_client *c = rl_lua_check_client(L, 1);
  const char **argv;
  size_t *len;
  int argc = rl_lua_command_args(L, 2, &argv, &len);
  char err[RL_ERRLEN];
  redisReply *r;
  lua_pushcfunction(L, rl_lua_push_reply_protected);
  arm_asking(c, &c->conn);
  r = rl_conn_command(&c->conn, argc, argv, len, 0, err); /* INCR twice is wrong */
  c->conn.asking = 0;
  if (r == NULL) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  return rl_lua_push_command_reply(L, r, lua_gettop(L));
}

/*
 * client:script(op, keys, ...) -> reply | nil, err
 * One script sent with its caller's arguments (rl_lua_check_args: op the
 * name of one, "inspect", "multi_acquire" ..., or a guard's script; keys a
 * lock key, or an array), EVAL after NOSCRIPT; its reply as command's.
 */
static int client_script(lua_State *L) {
  rl_client *c = rl_lua_check_client(L, 1);
  int top = lua_gettop(L);
  rl_args_cmd a;
  char err[RL_ERRLEN];
  redisReply *r;
  lua_pushcfunction(L, rl_lua_push_reply_protected); /* at top + 1 */
  rl_lua_check_args(L, 2, top, c->prefix, c->plen, &a);
  arm_asking(c, &c->conn);
  r = rl_conn_args(&c->conn, &a, err);
  c->conn.asking = 0;
  rl_args_free(&a);
  if (r == NULL) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  return rl_lua_push_command_reply(L, r, top + 1);
}

/*
 * client:wait(key, token, ms[, op]) -> wake-up | false | nil, err
 * Blocks on the wake-up list of the lock (or of the semaphore or read-write
 * lock op belongs to; the shared one, or a registered waiter's own when
 * token is not nil) for at most ms, on the client's second connection so
 * that the first stays free. When woken, what woke it (a string: "1", or a
 * handoff's "<fence> <age> <at>", see csrc/scripts/README.md); false when the time
 * ran out.
 */
static int client_wait(lua_State *L) {
  rl_client *c = rl_lua_check_client(L, 1);
  char err[RL_ERRLEN];
  long long ms;
  rl_cmd cmd;
  redisReply *r;
  int type;
  lua_settop(L, 5);
  lua_pushcfunction(L, rl_lua_push_reply_protected); /* at 6, before anything is allocated */
  rl_lua_check_wait(L, 2, 5, c->prefix, c->plen, &cmd, &ms);
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
  if (r->type == REDIS_REPLY_ERROR) return rl_lua_push_command_reply(L, r, 6);
  type = r->type;
  if (type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[1]->type == REDIS_REPLY_STRING &&
      r->element[1]->len < sizeof err) { /* copied out: nothing may raise while r is alive */
    size_t len = r->element[1]->len;
    memcpy(err, r->element[1]->str, len);
    freeReplyObject(r);
    lua_pushlstring(L, err, len);
    return 1;
  }
  freeReplyObject(r);
  lua_pushboolean(L, type == REDIS_REPLY_ARRAY);
  return 1;
}

/* client:closed() -> true once the client was closed. */
static int client_closed(lua_State *L) {
  lua_pushboolean(L, ((rl_client *)luaL_checkudata(L, 1, RL_CLIENT_MT))->closed);
  return 1;
}

/* client:close(): closes the connection for good; later calls raise. */
static int client_close(lua_State *L) {
  client_free((rl_client *)luaL_checkudata(L, 1, RL_CLIENT_MT));
  return 0;
}

/* __tostring: "redislock.Client (127.0.0.1:6379)", "... (127.0.0.1:6380, TLS)" or "redislock.Client (closed)". */
static int client_tostring(lua_State *L) {
  rl_client *c = (rl_client *)luaL_checkudata(L, 1, RL_CLIENT_MT);
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
 * client:retarget(host, port) -> true
 * Points the client's connections at another TCP host and port (the master
 * Sentinel named): they are closed, and the next call connects there; the
 * leases the watchdog renews on the old address go along (rl_watchdog_move).
 */
static int client_retarget(lua_State *L) {
  rl_client *c = rl_lua_check_client(L, 1);
  const char *host = luaL_checkstring(L, 2);
  lua_Integer port = luaL_checkinteger(L, 3);
  luaL_argcheck(L, strlen(host) == lua_rawlen(L, 2) && host[0] != '\0', 2,
                "host must be a non-empty string without NUL");
  luaL_argcheck(L, port >= 1 && port <= 65535, 3, "port must be in 1..65535");
  luaL_argcheck(L, c->conn.o.path == NULL, 1, "a client on a unix socket cannot move to a TCP host");
  /* The connections first, then the leases: a lease never points where
     the client does not. The old address is kept for rl_watchdog_move. */
  size_t flen = c->conn.o.host != NULL ? strlen(c->conn.o.host) + 1 : 0;
  char *from = flen > 0 ? (char *)malloc(flen) : NULL;
  int from_port = c->conn.o.port, failed = flen > 0 && from == NULL;
  if (from != NULL) memcpy(from, c->conn.o.host, flen);
  failed = failed || rl_conn_retarget(&c->conn, host, (int)port) != 0 ||
           rl_conn_retarget(&c->waiter, host, (int)port) != 0 ||
           (from != NULL && rl_watchdog_move(from, from_port, host, (int)port) < 0);
  free(from);
  if (failed) return luaL_error(L, "redislock: out of memory");
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
  lua_pushboolean(L, rl_conn_usable(&rl_lua_check_client(L, 1)->conn));
  return 1;
}

/*
 * core.eval_many(timeout_ms, op, key, token, ms, client, ...) -> statuses, values
 * Runs one lock script (op as client:eval takes it) on every
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
  op = rl_lua_check_script(L, 2, 0, &key, &klen, &token, &tlen, &ms, &nlimit);
  luaL_argcheck(L, op != RL_OP_TAKE, 2, "a take runs on one connection only");
  luaL_argcheck(L, n >= 1 && n <= RL_MANY_MAX, 6, "1 to 64 clients expected");
  for (i = 0; i < n; i++) conns[i] = &rl_lua_check_client(L, 6 + i)->conn;
  /* One block for the commands and answers, freed by Lua (no leak if a later step raises). */
  cmds = (rl_cmd *)lua_newuserdatauv(L, (sizeof *cmds + sizeof *out + sizeof *rc + sizeof *err) * (size_t)n, 0);
  out = (rl_result *)(cmds + n);
  rc = (int *)(out + n);
  err = (char (*)[RL_ERRLEN])(rc + n);
  for (i = 0; i < n; i++) {
    rl_client *c = rl_lua_check_client(L, 6 + i);
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

/*
 * client:holder(holder, label) -> true
 * What the tokens of the common acquire (core.fast_take) end with, as
 * core.tokens makes them (rl_tokens): holder (a string, "/<host>/", or
 * nil: 32 hex digits alone), the pid, "/", the unix second, then label (a
 * string, "" for none).
 */
static int client_holder(lua_State *L) {
  rl_client *c = rl_lua_check_client(L, 1);
  size_t hlen = 0, llen = 0;
  const char *holder = luaL_optlstring(L, 2, NULL, &hlen), *label = luaL_checklstring(L, 3, &llen);
  char *mem = holder != NULL ? (char *)malloc(rl_tokens_room(hlen, llen)) : NULL;
  if (holder != NULL && mem == NULL) return luaL_error(L, "redislock: out of memory");
  free(c->tokens.buf);
  rl_tokens_init(&c->tokens, mem, holder, hlen, label, llen);
  lua_pushboolean(L, 1);
  return 1;
}

/* The upvalues of core.fast_release's functions (fast_release): the
   locks' and the clients' metatables, "held", whether with_lock's, the
   leases' metatable, then the names of the lock's fields it reads. */
enum { UV_LOCK_MT = 1, UV_CLIENT_MT, UV_HELD, UV_LEASED, UV_LEASE_MT, UV_RELEASE, UV_T, UV_STATE, UV_KEY, UV_TOKEN,
       UV_LEASE, UV_EXPIRES, UV_COUNT = UV_EXPIRES };

/* Pushes field name of the table at idx, raw, the name the string at
   upvalue uv (kept, not made from a C string on every call). */
static void raw_field(lua_State *L, int idx, int uv) {
  lua_pushvalue(L, lua_upvalueindex(uv));
  lua_rawget(L, idx);
}

/* The module's client in field _t (the name at upvalue UV_T) of the lock
   at idx, open, or NULL. Upvalue uv is the clients' metatable. Pushes the
   field. */
static rl_client *lock_client(lua_State *L, int idx, int uv) {
  rl_client *c;
  raw_field(L, idx, UV_T);
  c = (rl_client *)lua_touserdata(L, -1);
  if (c == NULL || !lua_getmetatable(L, -1)) return NULL;
  if (!lua_rawequal(L, -1, lua_upvalueindex(uv))) c = NULL;
  lua_pop(L, 1);
  return c != NULL && !c->closed ? c : NULL;
}

/* Whether the value at idx has the metatable at upvalue uv. */
static int has_meta(lua_State *L, int idx, int uv) {
  int same;
  if (!lua_getmetatable(L, idx)) return 0;
  same = lua_rawequal(L, -1, lua_upvalueindex(uv));
  lua_pop(L, 1);
  return same;
}

/*
 * The take of the common case (fast_take, fast_with): for client c at 1,
 * key at 2 and a TTL at 3 in seconds that pass acquire's checks (*ms: in
 * milliseconds), sends the take with a new token (client:holder's) and
 * leaves its answer: fence, token, sent (core.now() before the send) and
 * expires (sent plus the TTL); when it did not take the lock, false, the
 * token, and what client:eval answered (-1 and the holder's PTTL; nil,
 * the message and what the take left). Leaves nothing, having done
 * nothing, for any other key or TTL. Returns how many values it left;
 * *sent_ms: sent in whole ms, when it took the lock.
 */
static int take(lua_State *L, rl_client *c, long long *ms, long long *sent_ms) {
  const char *key, *token;
  size_t klen, tlen;
  lua_Number sent;
  rl_call call;
  int tidx;
  if (lua_type(L, 2) != LUA_TSTRING || lua_type(L, 3) != LUA_TNUMBER) return 0;
  key = lua_tolstring(L, 2, &klen);
  if (rl_check_key(key, klen) != NULL || rl_seconds_to_ms((double)lua_tonumber(L, 3), ms) != NULL) return 0;
  rl_lua_push_token(L, &c->tokens);
  tidx = lua_gettop(L);
  token = lua_tolstring(L, tidx, &tlen);
  sent = rl_lua_now();
  call.replicas = call.replica_ms = 0;
  if (run(L, c, &call, RL_OP_TAKE, key, klen, token, tlen, *ms, 0) != 0) {
    lua_pushboolean(L, 0);
    lua_pushvalue(L, tidx);
    return 2 + rl_lua_push_failed(L, &call);
  }
  if (call.out.status != RL_HELD) {
    lua_pushboolean(L, 0);
    lua_pushvalue(L, tidx);
    lua_pushinteger(L, call.out.status);
    lua_pushinteger(L, (lua_Integer)call.out.value);
    return 4;
  }
  lua_pushinteger(L, (lua_Integer)call.out.value);
  lua_pushvalue(L, tidx);
  lua_pushnumber(L, sent);
  lua_pushnumber(L, sent + (lua_Number)*ms / 1000);
  *sent_ms = (long long)floor(sent * 1000);
  return 4;
}

/* The client at 1 when it is an open client of this module (upvalue 1:
   the clients' metatable), else NULL. */
static rl_client *open_client(lua_State *L) {
  rl_client *c = (rl_client *)lua_touserdata(L, 1);
  return c != NULL && has_meta(L, 1, 1) && !c->closed ? c : NULL;
}

/*
 * core.fast_take(client, key, ttl[, opts]): Client:acquire's common case
 * in one call, for client (redislock/client.lua's, one server in plain
 * Lua without an observer), open, a key and a TTL in seconds that pass
 * acquire's checks, no options: what take leaves. Leaves nothing, having
 * done nothing, for any other call: the general path then checks and runs
 * it. Upvalue 1: the clients' metatable.
 */
static int fast_take(lua_State *L) {
  int top = lua_gettop(L);
  long long ms = 0, sent_ms;
  rl_client *c;
  if (top < 3 || top > 4 || (top == 4 && !lua_isnil(L, 4)) || (c = open_client(L)) == NULL) return 0;
  return take(L, c, &ms, &sent_ms);
}

/*
 * core.fast_with(client, key, ttl, fn[, opts]): Client:with_lock's common
 * case, as fast_take's, fn a function: what take leaves and, when it took
 * the lock, its renewal (the lock given to the watchdog as with_lock's
 * are: client:lease(key, token, ttl_ms, { sent_ms = sent })) and the TTL
 * in ms, or nil and why the renewal could not start. Leaves nothing,
 * having done nothing, for any other call. Upvalues: the clients' and the
 * leases' metatables.
 */
static int fast_with(lua_State *L) {
  int top = lua_gettop(L), n;
  long long ms = 0, sent_ms = 0;
  rl_client *c;
  if (top < 4 || top > 5 || (top == 5 && !lua_isnil(L, 5)) || lua_type(L, 4) != LUA_TFUNCTION ||
      (c = open_client(L)) == NULL)
    return 0;
  lua_settop(L, 5);
  n = take(L, c, &ms, &sent_ms);
  if (n != 4 || !lua_toboolean(L, -4)) return n;
  {
    size_t klen, tlen;
    const char *key = lua_tolstring(L, 2, &klen), *token = lua_tolstring(L, -3, &tlen);
    if (rl_lua_push_lease(L, c, lua_upvalueindex(2), RL_OP_EXTEND, key, klen, token, tlen, ms, 0, 0, sent_ms) == 2)
      return 6;
  }
  lua_pushinteger(L, (lua_Integer)ms);
  return 6;
}

/*
 * release(lock) (core.fast_release's): the release of a lock of
 * Client:acquire's or Client:with_lock's common case in one call. lock (the
 * metatable at UV_LOCK_MT; no other argument) has a release field of its
 * own (only those locks do: redislock/lock.lua's new), its _t an open
 * client of this module, and is held by its own account (_state "held").
 * With UV_LEASED true (with_lock's), its renewal, if any (_lease, a lease
 * of the metatable at UV_LEASE_MT), is stopped first, while it still
 * holds the lock (its expiry kept in _expires, as lease.lua's stop keeps
 * it). Sends the release and leaves true when it released; else false
 * and what client:eval answered. Leaves nothing, having done nothing, for
 * any other call, or a renewal that found the lock lost or ended. The
 * fields are read raw, by names kept as upvalues.
 */
static int fast_release(lua_State *L) {
  rl_client *c;
  const char *key, *token;
  size_t klen, tlen;
  rl_call call;
  if (lua_gettop(L) != 1 || !has_meta(L, 1, UV_LOCK_MT)) return 0;
  raw_field(L, 1, UV_RELEASE);
  if (lua_isnil(L, 2) || (c = lock_client(L, 1, UV_CLIENT_MT)) == NULL) return 0; /* at 3 */
  raw_field(L, 1, UV_STATE);
  raw_field(L, 1, UV_KEY);
  raw_field(L, 1, UV_TOKEN);
  if (!lua_rawequal(L, 4, lua_upvalueindex(UV_HELD)) || lua_type(L, 5) != LUA_TSTRING ||
      lua_type(L, 6) != LUA_TSTRING)
    return 0;
  key = lua_tolstring(L, 5, &klen);
  token = lua_tolstring(L, 6, &tlen);
  if (rl_check_key(key, klen) != NULL || tlen == 0) return 0;
  if (lua_toboolean(L, lua_upvalueindex(UV_LEASED))) {
    lua_Number at;
    raw_field(L, 1, UV_LEASE); /* at 7 */
    if (!lua_isnil(L, 7)) {
      if (!rl_lua_stop_held_lease(L, 7, lua_upvalueindex(UV_LEASE_MT), &at)) return 0;
      lua_pushvalue(L, lua_upvalueindex(UV_EXPIRES));
      lua_pushnumber(L, at);
      lua_rawset(L, 1);
    }
  }
  call.replicas = call.replica_ms = 0;
  if (run(L, c, &call, RL_OP_RELEASE, key, klen, token, tlen, 0, 0) != 0) {
    lua_pushboolean(L, 0);
    lua_pushnil(L);
    lua_pushstring(L, call.err);
    return 3;
  }
  if (call.out.status == RL_HELD) {
    lua_pushboolean(L, 1);
    return 1;
  }
  lua_pushboolean(L, 0);
  lua_pushinteger(L, call.out.status);
  lua_pushinteger(L, (lua_Integer)call.out.value);
  return 3;
}

/* core.fast_release(lock_mt) -> release, leased: Lock:release's common
   case for the locks of that metatable (redislock/lock.lua's), see
   fast_release: acquire's, and with_lock's (its renewal stopped first). */
static int core_fast_release(lua_State *L) {
  static const char *const names[] = { "release", "_t", "_state", "key", "token", "_lease", "_expires" };
  int leased, i;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  luaL_getmetatable(L, RL_CLIENT_MT);
  lua_pushliteral(L, "held");
  for (leased = 0; leased <= 1; leased++) {
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 3);
    lua_pushboolean(L, leased);
    luaL_getmetatable(L, RL_LEASE_MT);
    for (i = 0; i < UV_COUNT - UV_LEASE_MT; i++) lua_pushstring(L, names[i]);
    lua_pushcclosure(L, fast_release, UV_COUNT);
  }
  return 2;
}

static const luaL_Reg client_methods[] = {
  { "eval", client_eval },
  { "command", client_command },
  { "script", client_script },
  { "wait", client_wait },
  { "lease", rl_lua_client_lease },
  { "close", client_close },
  { "closed", client_closed },
  { "retarget", client_retarget },
  { "usable", client_usable },
  { "asking", client_asking },
  { "holder", client_holder },
  { NULL, NULL }
};

static const luaL_Reg client_meta[] = {
  { "__gc", client_close },
  { "__close", client_close },
  { "__tostring", client_tostring },
  { NULL, NULL }
};

static const luaL_Reg client_functions[] = {
  { "new", core_new },
  { "check_tls", core_check_tls },
  { "eval_many", core_eval_many },
  { "fast_release", core_fast_release },
  { NULL, NULL }
};

void rl_lua_open_client(lua_State *L) {
  rl_lua_newtype(L, RL_CLIENT_MT, client_meta, client_methods);
  luaL_setfuncs(L, client_functions, 0);
  luaL_getmetatable(L, RL_CLIENT_MT);
  lua_pushcclosure(L, fast_take, 1);
  lua_setfield(L, -2, "fast_take");
  luaL_getmetatable(L, RL_CLIENT_MT);
  luaL_getmetatable(L, RL_LEASE_MT);
  lua_pushcclosure(L, fast_with, 2);
  lua_setfield(L, -2, "fast_with");
}
