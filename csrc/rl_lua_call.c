/* SPDX-License-Identifier: MIT */
/*
 * The Call type of redislock.core (core.script_call, core.command_call,
 * core.args_call): the
 * call state machine (rl_call.h) for a transport written in Lua, the
 * OpenResty one (lua/redislock/ngx.lua), which sends the bytes it is given
 * on a cosocket and feeds back what it reads:
 *
 *   local step, bytes = call:start(reused)      -- "send", bytes
 *   "send":      send bytes, then "read"
 *   "read":      step, bytes = call:feed(data)  (or call:lost(timed_out, msg))
 *   "reconnect": another connection, then call:start(reused)
 *   "done", "failed": call:keep() says whether the connection goes back to
 *                the pool; call:result() is what eval or command returns
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rl_call.h"
#include "rl_lua.h"

#define CALL_MT "redislock.Call"

typedef struct {
  rl_call call;
  rl_cmd cmd;            /* a lock script's */
  rl_args_cmd args;      /* a script's with its caller's arguments (args.mem set) */
  redisReader *reader;   /* the connection's replies; a new one per connection */
  char *command;         /* a plain command's bytes, copied */
  char *token;           /* a script's token, copied: cmd points at it */
  int open;              /* call (and cmd, for a script) hold what close frees */
  char where[128];
} call_ud;

/* The names of the steps, in rl_step's order. */
static const char *const STEPS[] = { "send", "read", "reconnect", "done", "failed" };

/* __gc and __close: frees what the call holds. Idempotent. */
static int call_close(lua_State *L) {
  call_ud *c = (call_ud *)luaL_checkudata(L, 1, CALL_MT);
  if (c->open) {
    rl_call_free(&c->call);
    if (c->call.cmd != NULL) rl_cmd_free(&c->cmd);
    c->open = 0;
  }
  if (c->reader != NULL) redisReaderFree(c->reader);
  rl_args_free(&c->args);
  free(c->command);
  free(c->token);
  c->reader = NULL;
  c->command = NULL;
  c->token = NULL;
  return 0;
}

/* The call at 1, refusing other values and calls already closed. */
static call_ud *check_call(lua_State *L) {
  call_ud *c = (call_ud *)luaL_checkudata(L, 1, CALL_MT);
  if (!c->open) luaL_argerror(L, 1, "call is closed");
  return c;
}

/*
 * Pushes a closed call for transport t (at 1), its where copied in, and
 * sets *timeout_ms to t's timeout_ms. Raises on a bad t.
 */
static call_ud *new_call(lua_State *L, long long *timeout_ms) {
  call_ud *c;
  c = (call_ud *)lua_newuserdatauv(L, sizeof *c, 0);
  c->open = 0;
  c->reader = NULL;
  c->args.mem = NULL;
  c->command = NULL;
  c->token = NULL;
  luaL_setmetatable(L, CALL_MT);
  lua_getfield(L, 1, "where");
  lua_getfield(L, 1, "timeout_ms");
  snprintf(c->where, sizeof c->where, "%s", lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?");
  {
    int isnum = 0;
    lua_Integer ms = lua_tointegerx(L, -1, &isnum);
    *timeout_ms = isnum && ms >= 1 && ms <= RL_MAX_MS ? (long long)ms : 1000;
  }
  lua_pop(L, 2);
  return c;
}

/* After rl_call_init: the fields it reset that new_call read. */
static void set_fields(call_ud *c, long long timeout_ms) {
  c->call.where = c->where;
  c->call.timeout_ms = timeout_ms;
  c->open = 1;
}

/*
 * core.script_call(t, op, key, token[, ms[, n]]) -> call
 * A call of one lock script (op as client:eval's, "take" too) for the
 * transport t, whose prefix, where and timeout_ms it reads.
 */
static int core_script_call(lua_State *L) {
  const char *key, *token, *prefix, *why;
  size_t klen, tlen, plen;
  long long ms, n, timeout;
  rl_op op;
  call_ud *c;
  luaL_checktype(L, 1, LUA_TTABLE);
  op = rl_lua_check_script(L, 2, 6, &key, &klen, &token, &tlen, &ms, &n);
  lua_settop(L, 6);
  lua_getfield(L, 1, "prefix"); /* at 7: the string stays alive below */
  prefix = luaL_checklstring(L, 7, &plen);
  why = rl_check_prefix(prefix, plen);
  if (why != NULL) luaL_argerror(L, 1, lua_pushfstring(L, "prefix %s", why));
  c = new_call(L, &timeout); /* at 8 */
  /* The command points at its token: a copy that lives as long as the call. */
  c->token = (char *)malloc(tlen);
  if (c->token == NULL) return luaL_error(L, "redislock: out of memory");
  memcpy(c->token, token, tlen);
  if (rl_cmd_init(&c->cmd, op, prefix, plen, key, klen, c->token, tlen, ms, n) != 0)
    return luaL_error(L, "redislock: out of memory");
  rl_call_init(&c->call, &c->cmd);
  set_fields(c, timeout);
  return 1;
}

/*
 * core.command_call(t, bytes[, resend]) -> call
 * A call of one plain command, its bytes made by core.encode or
 * core.encode_wait, for the transport t; resend: safe to send twice.
 */
static int core_command_call(lua_State *L) {
  size_t len;
  const char *bytes;
  int resend = lua_toboolean(L, 3);
  long long timeout;
  call_ud *c;
  luaL_checktype(L, 1, LUA_TTABLE);
  bytes = luaL_checklstring(L, 2, &len);
  lua_settop(L, 3);
  c = new_call(L, &timeout);
  c->command = (char *)malloc(len > 0 ? len : 1);
  if (c->command == NULL) return luaL_error(L, "redislock: out of memory");
  memcpy(c->command, bytes, len);
  rl_call_init_command(&c->call, c->command, len, resend);
  set_fields(c, timeout);
  return 1;
}

/*
 * core.args_call(t, op, keys, ...) -> call
 * A call of one script sent with its caller's arguments (as client:script,
 * rl_lua_check_args) for the transport t, whose prefix, where and
 * timeout_ms it reads.
 */
static int core_args_call(lua_State *L) {
  const char *prefix, *why;
  size_t plen;
  long long timeout;
  int top = lua_gettop(L);
  call_ud *c;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "prefix"); /* at top + 1: the string stays alive below */
  prefix = luaL_checklstring(L, top + 1, &plen);
  why = rl_check_prefix(prefix, plen);
  if (why != NULL) luaL_argerror(L, 1, lua_pushfstring(L, "prefix %s", why));
  c = new_call(L, &timeout); /* at top + 2: it frees args when collected */
  rl_lua_check_args(L, 2, top, prefix, plen, &c->args);
  rl_call_init_args(&c->call, &c->args);
  set_fields(c, timeout);
  lua_pushvalue(L, top + 2);
  return 1;
}

/* call:asking(): ASKING goes before the command (a cluster's ASK redirect). */
static int call_asking(lua_State *L) {
  check_call(L)->call.asking = 1;
  return 0;
}

/* call:replicas(n, ms): a script that answers 1 is followed by WAIT n ms. */
static int call_replicas(lua_State *L) {
  call_ud *c = check_call(L);
  int isnum = 0, isnum2 = 0;
  lua_Integer n = lua_tointegerx(L, 2, &isnum), ms = lua_tointegerx(L, 3, &isnum2);
  luaL_argcheck(L, lua_type(L, 2) == LUA_TNUMBER && isnum && n >= 1 && n <= 1000000, 2,
                "replicas must be an integer >= 1");
  luaL_argcheck(L, lua_type(L, 3) == LUA_TNUMBER && isnum2 && ms >= 1 && ms <= RL_MAX_MS, 3,
                "replica_ms must be an integer number of milliseconds >= 1");
  c->call.replicas = (long long)n;
  c->call.replica_ms = (long long)ms;
  return 0;
}

/* call:timeout(ms): the time a reply may take (a wait's: its own plus the transport's). */
static int call_timeout(lua_State *L) {
  call_ud *c = check_call(L);
  int isnum = 0;
  lua_Integer ms = lua_tointegerx(L, 2, &isnum);
  luaL_argcheck(L, lua_type(L, 2) == LUA_TNUMBER && isnum && ms >= 1 && ms <= RL_MAX_MS, 2,
                "timeout must be an integer number of milliseconds >= 1");
  c->call.timeout_ms = (long long)ms;
  return 0;
}

/* Pushes the step's name, and the bytes to send after "send". */
static int push_step(lua_State *L, call_ud *c, rl_step step) {
  lua_pushstring(L, STEPS[step]);
  if (step == RL_STEP_SEND) {
    size_t len;
    const char *bytes = rl_call_bytes(&c->call, &len);
    lua_pushlstring(L, bytes, len);
    return 2;
  }
  return 1;
}

/* call:start(reused) -> "send", bytes | "failed": a connection is ready
   (reused: how often it served before, or a boolean). */
static int call_start(lua_State *L) {
  call_ud *c = check_call(L);
  int reused = lua_isnumber(L, 2) ? lua_tointeger(L, 2) > 0 : lua_toboolean(L, 2);
  /* A new connection: the reader starts empty. */
  if (c->reader != NULL) redisReaderFree(c->reader);
  c->reader = redisReaderCreate();
  if (c->reader == NULL) return luaL_error(L, "redislock: out of memory");
  return push_step(L, c, rl_call_start(&c->call, reused, c->reader));
}

/* call:feed(data) -> step[, bytes]: bytes read from the connection. */
static int call_feed(lua_State *L) {
  call_ud *c = check_call(L);
  size_t len;
  const char *data = luaL_checklstring(L, 2, &len);
  if (c->reader == NULL) return luaL_error(L, "redislock: call:feed before call:start");
  return push_step(L, c, rl_call_feed(&c->call, data, len));
}

/* call:lost(timed_out, msg) -> step: the send or a read failed (the connection is closed). */
static int call_lost(lua_State *L) {
  call_ud *c = check_call(L);
  const char *msg = luaL_checkstring(L, 3);
  return push_step(L, c, rl_call_lost(&c->call, lua_toboolean(L, 2), msg));
}

/* call:read_ms() -> how long the replies to the bytes just sent may take. */
static int call_read_ms(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)rl_call_read_ms(&check_call(L)->call));
  return 1;
}

/* call:keep() -> whether the connection may go back to the pool. */
static int call_keep(lua_State *L) {
  lua_pushboolean(L, rl_call_keep(&check_call(L)->call));
  return 1;
}

/* nil, call->err[, what its take left] (see rl_lua.h): leaves 2 or 3 values. */
int rl_lua_push_failed(lua_State *L, const rl_call *call) {
  const char *left = rl_left_name(call->left);
  lua_pushnil(L);
  lua_pushstring(L, call->err);
  if (left == NULL) return 2;
  lua_pushstring(L, left);
  return 3;
}

/*
 * call:result() -> what client:eval or client:command returns: for a
 * script, status, value[, acked | nil, err] or nil, err[, left] (left: what
 * a failed take left, see rl_lua_push_failed); for a command, its reply
 * (nil, "redis: ..." for an error reply) or nil, err. After "done" or
 * "failed"; a command's reply can be had once.
 */
static int call_result(lua_State *L) {
  call_ud *c = check_call(L);
  rl_call *call = &c->call;
  redisReply *r = call->reply;
  lua_settop(L, 1);
  if (call->err[0] != '\0') return rl_lua_push_failed(L, call);
  if (call->cmd == NULL) {
    if (r == NULL) return luaL_error(L, "redislock: call:result before the call is done");
    call->reply = NULL;
    lua_pushcfunction(L, rl_lua_push_reply_protected); /* at 2 */
    return rl_lua_push_command_reply(L, r, 2);
  }
  lua_pushinteger(L, call->out.status);
  lua_pushinteger(L, (lua_Integer)call->out.value);
  if (call->replicas == 0 || call->out.status != RL_HELD) return 2;
  if (call->wait_err[0] != '\0') {
    lua_pushnil(L);
    lua_pushstring(L, call->wait_err);
    return 4;
  }
  lua_pushinteger(L, (lua_Integer)call->acked);
  return 3;
}

/* __tostring: "redislock.Call (<where>)", or "(closed)". */
static int call_tostring(lua_State *L) {
  call_ud *c = (call_ud *)luaL_checkudata(L, 1, CALL_MT);
  if (c->open) lua_pushfstring(L, "redislock.Call (%s)", c->where);
  else lua_pushliteral(L, "redislock.Call (closed)");
  return 1;
}

static const luaL_Reg call_methods[] = {
  { "start", call_start },
  { "feed", call_feed },
  { "lost", call_lost },
  { "read_ms", call_read_ms },
  { "keep", call_keep },
  { "result", call_result },
  { "asking", call_asking },
  { "replicas", call_replicas },
  { "timeout", call_timeout },
  { "close", call_close },
  { NULL, NULL }
};

static const luaL_Reg call_meta[] = {
  { "__gc", call_close },
  { "__close", call_close },
  { "__tostring", call_tostring },
  { NULL, NULL }
};

static const luaL_Reg call_funcs[] = {
  { "script_call", core_script_call },
  { "command_call", core_command_call },
  { "args_call", core_args_call },
  { NULL, NULL }
};

void rl_lua_open_call(lua_State *L) {
  rl_lua_newtype(L, CALL_MT, call_meta, call_methods);
  luaL_setfuncs(L, call_funcs, 0);
}
