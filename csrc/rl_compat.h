/* SPDX-License-Identifier: MIT */
/*
 * Lua version differences, in one place, keyed on LUA_VERSION_NUM. 501 is
 * LuaJIT 2.1 (OpenResty's), which already has luaL_setfuncs, luaL_testudata,
 * and luaL_setmetatable; what it lacks or does differently is renamed here to
 * hidden rl_compat_* helpers so no symbol but luaopen_* leaves the module.
 */
#ifndef REDISLOCK_RL_COMPAT_H
#define REDISLOCK_RL_COMPAT_H

#include <lua.h>
#include <lauxlib.h>

#if LUA_VERSION_NUM < 504
#define lua_newuserdatauv(L, size, nuv) lua_newuserdata((L), (size))
#endif

#if LUA_VERSION_NUM < 503
/*
 * LuaJIT's lua_tointegerx truncates 2.5 to 2 and calls it a number; 5.3+
 * refuses it. Rename to a version that accepts only integral values.
 */
#define lua_tointegerx rl_compat_tointegerx
static inline lua_Integer rl_compat_tointegerx(lua_State *L, int idx, int *isnum) {
  int ok = 0;
  lua_Number n = lua_tonumberx(L, idx, &ok);
  ok = ok && n >= -9007199254740992.0 && n <= 9007199254740992.0 &&
       n == (lua_Number)(lua_Integer)n;
  if (isnum != NULL) *isnum = ok;
  return ok ? (lua_Integer)n : 0;
}
#endif

#if LUA_VERSION_NUM == 501
#define lua_rawlen(L, idx) lua_objlen((L), (idx))
#endif

#if defined(__GNUC__)
#define RL_EXPORT __attribute__((visibility("default")))
#else
#define RL_EXPORT
#endif

#endif
