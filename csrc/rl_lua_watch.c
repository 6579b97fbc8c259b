/* SPDX-License-Identifier: MIT */
/* The SentinelWatch type of redislock.core (core.sentinel_watch): a thread
   subscribed to +switch-master. */
#include "rl_lua.h"
#include "rl_sentinel.h"

#define WATCH_MT "redislock.SentinelWatch"

typedef struct {
  rl_sentinel_watch *w; /* NULL once stopped */
} rl_watch_ud;

/*
 * core.sentinel_watch(master, client, ...) -> watch
 * Starts a thread that stays subscribed to +switch-master on one of the
 * sentinels the clients (core.new) connect to, the next one when it fails
 * (see rl_sentinel.h). watch:count() grows with every switch of master heard
 * and every subscription lost or made; watch:heard() names the master the
 * last switch announced; watch:close() (also __gc) stops it.
 */
static int core_sentinel_watch(lua_State *L) {
  const char *master = luaL_checkstring(L, 1);
  int n = lua_gettop(L) - 1, i;
  rl_conn_opts *opts;
  rl_watch_ud *ud;
  char err[RL_ERRLEN];
  luaL_argcheck(L, n >= 1, 2, "a sentinel client expected");
  for (i = 0; i < n; i++) rl_lua_check_client(L, 2 + i);
  ud = (rl_watch_ud *)lua_newuserdatauv(L, sizeof *ud, 0);
  ud->w = NULL;
  luaL_setmetatable(L, WATCH_MT);
  opts = (rl_conn_opts *)lua_newuserdatauv(L, sizeof *opts * (size_t)n, 0); /* freed by Lua */
  for (i = 0; i < n; i++) opts[i] = rl_lua_check_client(L, 2 + i)->conn.o;
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

/*
 * watch:heard() -> host, port | nil: the master the last switch heard
 * announced, while nothing else was counted since (rl_sentinel_watch_heard).
 */
static int watch_heard(lua_State *L) {
  char host[256];
  int port = rl_sentinel_watch_heard(check_watch(L)->w, host);
  if (port == 0) return 0;
  lua_pushstring(L, host);
  lua_pushinteger(L, port);
  return 2;
}

/* watch:close(), __gc: stops the thread. Idempotent. */
static int watch_close(lua_State *L) {
  rl_watch_ud *ud = (rl_watch_ud *)luaL_checkudata(L, 1, WATCH_MT);
  if (ud->w != NULL) rl_sentinel_watch_stop(ud->w);
  ud->w = NULL;
  return 0;
}

static const luaL_Reg watch_methods[] = {
  { "count", watch_count },
  { "heard", watch_heard },
  { "close", watch_close },
  { NULL, NULL }
};

static const luaL_Reg watch_meta[] = {
  { "__gc", watch_close },
  { "__close", watch_close },
  { NULL, NULL }
};

static const luaL_Reg watch_functions[] = {
  { "sentinel_watch", core_sentinel_watch },
  { NULL, NULL }
};

void rl_lua_open_watch(lua_State *L) {
  rl_lua_newtype(L, WATCH_MT, watch_meta, watch_methods);
  luaL_setfuncs(L, watch_functions, 0);
}
