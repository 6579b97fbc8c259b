/* SPDX-License-Identifier: MIT */
/*
 * spec_fork: fork(), _exit() and wait() for the fork spec, with luaposix's
 * signatures (Debian 12 has no luaposix for Lua 5.4). Test support only: built
 * by `make` next to the module, never installed.
 */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE
#endif
#include <string.h>
#include <errno.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include "lua.h"
#include "lauxlib.h"

static int shim_fork(lua_State *L) {
  pid_t pid = fork();
  if (pid < 0) return luaL_error(L, "fork: %s", strerror(errno));
  lua_pushinteger(L, (lua_Integer)pid);
  return 1;
}

static int shim_exit(lua_State *L) {
  _exit((int)luaL_checkinteger(L, 1));
  return 0;
}

static int shim_wait(lua_State *L) {
  pid_t pid = (pid_t)luaL_checkinteger(L, 1);
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return luaL_error(L, "waitpid: %s", strerror(errno));
  lua_pushinteger(L, (lua_Integer)pid);
  if (WIFEXITED(st)) {
    lua_pushstring(L, "exited");
    lua_pushinteger(L, WEXITSTATUS(st));
  } else {
    lua_pushstring(L, "killed");
    lua_pushinteger(L, WTERMSIG(st));
  }
  return 3;
}

__attribute__((visibility("default"))) int luaopen_spec_fork(lua_State *L);

/* Leaves { fork, _exit, wait } on the stack. */
__attribute__((visibility("default"))) int luaopen_spec_fork(lua_State *L) {
  lua_newtable(L);
  lua_pushcfunction(L, shim_fork);
  lua_setfield(L, -2, "fork");
  lua_pushcfunction(L, shim_exit);
  lua_setfield(L, -2, "_exit");
  lua_pushcfunction(L, shim_wait);
  lua_setfield(L, -2, "wait");
  return 1;
}
