/* SPDX-License-Identifier: MIT */
/* The cosocket side of redislock.core: commands as bytes (core.encode,
   core.encode_script, core.encode_wait) and the Reader type (core.reader)
   that decodes what the OpenResty transport reads. */
#include <stdlib.h>

#include "rl_lua.h"

#define READER_MT "redislock.Reader"

/*
 * The wire functions below do no I/O: the OpenResty transport
 * (lua/redislock/ngx.lua, its connections lua/redislock/ngx_conn.lua) sends
 * the bytes they make over cosockets and feeds what it reads into a Reader,
 * so the lock protocol stays in this core.
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
  rl_op op = rl_lua_check_script(L, 1, 7, &key, &klen, &token, &tlen, &ms, &n);
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

static const luaL_Reg reader_methods[] = {
  { "feed", reader_feed },
  { "reply", reader_reply },
  { "script_reply", reader_script_reply },
  { "take_reply", reader_take_reply },
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
