/* SPDX-License-Identifier: MIT */
/* The cosocket side of redislock.core: commands as bytes (core.encode,
   core.encode_script, core.encode_wait) and the Reader type (core.reader)
   that decodes the replies the OpenResty transport reads outside a call
   (a new connection's set-up, a subscription's messages). */
#include <stdlib.h>

#include "rl_lua.h"

#define READER_MT "redislock.Reader"

/*
 * The wire functions below do no I/O: the OpenResty transport
 * (lua/redislock/ngx.lua, its connections lua/redislock/ngx_conn.lua) sends
 * the bytes they make over cosockets (a call's, core.command_call's) and
 * feeds what it reads outside a call into a Reader.
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
 * core.encode_script(op, key, token, ms, prefix[, eval[, n]]) -> bytes
 * The bytes of one lock script command, as client:eval first sends it
 * (for the benchmarks' floors, which send the same bytes): EVALSHA, or
 * EVAL with the script text when eval is true. ms is ignored (may be nil)
 * for release and pttl; n is sem_acquire's limit. A take is MULTI, SET,
 * XADD of the slot's fence record, EXEC; with eval, the acquire script it
 * falls back on.
 */
static int core_encode_script(lua_State *L) {
  const char *key, *token, *prefix, *why;
  size_t klen, tlen, plen;
  long long ms, n;
  rl_op op = rl_lua_check_script(L, 1, 7, &key, &klen, &token, &tlen, &ms, &n);
  rl_cmd cmd;
  int status;
  prefix = luaL_checklstring(L, 5, &plen);
  why = rl_check_prefix(prefix, plen);
  if (why != NULL) luaL_argerror(L, 5, lua_pushfstring(L, "prefix %s", why));
  if (rl_cmd_init(&cmd, op, prefix, plen, key, klen, token, tlen, ms, n) != 0)
    return luaL_error(L, "redislock: out of memory");
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
  rl_lua_check_wait(L, 1, 5, prefix, plen, &cmd, &ms);
  status = push_formatted(L, cmd.argc, cmd.argv, cmd.len, NULL);
  rl_cmd_free(&cmd);
  if (status != 0) return lua_error(L);
  return 1;
}

/* core.encode(name, ...) -> bytes of one command; arguments are strings or numbers. */
static int core_encode(lua_State *L) {
  const char **argv;
  size_t *len;
  int argc = rl_lua_command_args(L, 1, &argv, &len);
  if (push_formatted(L, argc, argv, len, NULL) != 0) return lua_error(L);
  return 1;
}

typedef struct {
  redisReader *reader; /* NULL once freed */
} rl_reader;

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
  lua_pushcfunction(L, rl_lua_push_reply_protected); /* at 2, before the reply exists */
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
  return rl_lua_push_command_reply(L, r, 2);
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
  return 0;
}

static const luaL_Reg reader_methods[] = {
  { "feed", reader_feed },
  { "reply", reader_reply },
  { "close", reader_close },
  { NULL, NULL }
};

static const luaL_Reg reader_meta[] = {
  { "__gc", reader_close },
  { "__close", reader_close },
  { "__tostring", reader_tostring },
  { NULL, NULL }
};

static const luaL_Reg reader_functions[] = {
  { "encode_script", core_encode_script },
  { "encode", core_encode },
  { "encode_wait", core_encode_wait },
  { "reader", core_reader },
  { NULL, NULL }
};

void rl_lua_open_reader(lua_State *L) {
  rl_lua_newtype(L, READER_MT, reader_meta, reader_methods);
  luaL_setfuncs(L, reader_functions, 0);
}
