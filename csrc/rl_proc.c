/* SPDX-License-Identifier: MIT */
/*
 * Processes, for the `redislock` command (bin/redislock): start a command
 * (posix_spawnp, so that a process with the watchdog thread running never
 * forks a copy of it), look at how it ended, send it signals, and catch the
 * signals sent to us so that they can be passed on. Nothing here is about
 * locks; the command's Lua code does the locking.
 */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* environ, under -std=c99 */
#endif
#include "rl_proc.h"

#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* The signals the command knows by name. */
static const struct {
  const char *name;
  int signo;
} signals[] = {
  { "TERM", SIGTERM }, { "INT", SIGINT }, { "HUP", SIGHUP }, { "QUIT", SIGQUIT }, { "KILL", SIGKILL },
  { "USR1", SIGUSR1 }, { "USR2", SIGUSR2 }, { "PIPE", SIGPIPE }, { "ALRM", SIGALRM }, { "CHLD", SIGCHLD },
};
#define NSIGNALS (sizeof signals / sizeof signals[0])

/* The signals caught by proc_trap and not yet taken by proc_trapped, one flag each. */
static volatile sig_atomic_t caught[NSIGNALS];

static void on_signal(int signo) {
  size_t i;
  for (i = 0; i < NSIGNALS; i++)
    if (signals[i].signo == signo) caught[i] = 1;
}

/* The index in signals of the name at idx (raises on an unknown one). */
static size_t check_signal(lua_State *L, int idx) {
  const char *name = luaL_checkstring(L, idx);
  size_t i;
  for (i = 0; i < NSIGNALS; i++)
    if (strcmp(signals[i].name, name) == 0) return i;
  return (size_t)luaL_argerror(L, idx, lua_pushfstring(L, "unknown signal '%s'", name));
}

/*
 * core.spawn(argv, env) -> pid | nil, err, errno
 * Starts argv[1] (looked up in PATH as a shell would) with argv as its
 * arguments, in our environment plus env's NAME = value pairs, with every
 * signal at its default and none blocked. On failure (not found, not
 * executable) nil, a message and the errno.
 */
static int proc_spawn(lua_State *L) {
  size_t n, i, nenv = 0, extra = 0;
  char **argv, **envp;
  posix_spawnattr_t attr;
  sigset_t none, defaults;
  pid_t pid;
  int rc;
  luaL_checktype(L, 1, LUA_TTABLE);
  n = (size_t)lua_rawlen(L, 1);
  luaL_argcheck(L, n >= 1, 1, "a command expected");
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, 2) != 0) {
      luaL_argcheck(L, lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TSTRING, 2,
                    "names and values must be strings");
      extra++;
      lua_pop(L, 1);
    }
  }
  while (environ[nenv] != NULL) nenv++;
  /* Userdata, so that an error below frees them with the rest of Lua's memory. */
  argv = (char **)lua_newuserdatauv(L, (n + 1) * sizeof *argv, 0);
  envp = (char **)lua_newuserdatauv(L, (nenv + extra + 1) * sizeof *envp, 0);
  for (i = 0; i < n; i++) {
    lua_rawgeti(L, 1, (lua_Integer)(i + 1));
    luaL_argcheck(L, lua_type(L, -1) == LUA_TSTRING, 1, "the command's words must be strings");
    argv[i] = (char *)lua_tostring(L, -1); /* kept alive by the table at 1 */
    lua_pop(L, 1);
  }
  argv[n] = NULL;
  /* Ours first, then the environment less the names we set. */
  i = 0;
  if (extra > 0) {
    lua_pushnil(L);
    while (lua_next(L, 2) != 0) {
      lua_pushvalue(L, -2);
      lua_pushliteral(L, "=");
      lua_pushvalue(L, -3);
      lua_concat(L, 3);
      envp[i++] = (char *)lua_tostring(L, -1);
      lua_insert(L, 3); /* kept on the stack below the iteration */
      lua_pop(L, 1);
    }
  }
  for (size_t e = 0; e < nenv; e++) {
    const char *eq = strchr(environ[e], '=');
    size_t len = eq ? (size_t)(eq - environ[e]) : strlen(environ[e]);
    int shadowed = 0;
    for (size_t k = 0; k < i && k < extra; k++)
      if (strncmp(envp[k], environ[e], len) == 0 && envp[k][len] == '=') shadowed = 1;
    if (!shadowed) envp[i++] = environ[e];
  }
  envp[i] = NULL;
  sigemptyset(&none);
  sigfillset(&defaults);
  sigdelset(&defaults, SIGKILL);
  sigdelset(&defaults, SIGSTOP);
  if ((rc = posix_spawnattr_init(&attr)) != 0) goto failed;
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  rc = posix_spawnp(&pid, argv[0], NULL, &attr, argv, envp);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) goto failed;
  lua_pushinteger(L, (lua_Integer)pid);
  return 1;
failed:
  lua_pushnil(L);
  lua_pushfstring(L, "%s: %s", argv[0], strerror(rc));
  lua_pushinteger(L, rc);
  return 3;
}

/*
 * core.reap(pid) -> nil | "exited", status | "signaled", signal number
 * Without waiting: nil while the process runs; else how it ended (and it is
 * reaped). Raises on a pid that is not our child.
 */
static int proc_reap(lua_State *L) {
  lua_Integer pid = luaL_checkinteger(L, 1);
  int status;
  pid_t r;
  luaL_argcheck(L, pid > 0, 1, "pid must be > 0");
  do r = waitpid((pid_t)pid, &status, WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r < 0) return luaL_error(L, "redislock: waitpid: %s", strerror(errno));
  if (r == 0) return 0;
  if (WIFSIGNALED(status)) {
    lua_pushliteral(L, "signaled");
    lua_pushinteger(L, WTERMSIG(status));
  } else {
    lua_pushliteral(L, "exited");
    lua_pushinteger(L, WEXITSTATUS(status));
  }
  return 2;
}

/* core.kill(pid, name) -> true | nil, err: sends the signal named name ("TERM" ...). */
static int proc_kill(lua_State *L) {
  lua_Integer pid = luaL_checkinteger(L, 1);
  size_t s = check_signal(L, 2);
  luaL_argcheck(L, pid > 0, 1, "pid must be > 0");
  if (kill((pid_t)pid, signals[s].signo) != 0) {
    lua_pushnil(L);
    lua_pushstring(L, strerror(errno));
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/*
 * core.trap(name, ...) -> true
 * From now on the signals named are caught (not restarting system calls)
 * and remembered for core.trapped(), instead of ending the process.
 */
static int proc_trap(lua_State *L) {
  int top = lua_gettop(L), i;
  for (i = 1; i <= top; i++) {
    size_t s = check_signal(L, i);
    struct sigaction sa;
    luaL_argcheck(L, signals[s].signo != SIGKILL, i, "KILL cannot be caught");
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(signals[s].signo, &sa, NULL) != 0)
      return luaL_error(L, "redislock: sigaction: %s", strerror(errno));
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.trapped() -> { name, ... }: the signals caught since the last call. */
static int proc_trapped(lua_State *L) {
  size_t i;
  int n = 0;
  lua_newtable(L);
  for (i = 0; i < NSIGNALS; i++) {
    if (!caught[i]) continue;
    caught[i] = 0;
    lua_pushstring(L, signals[i].name);
    lua_rawseti(L, -2, ++n);
  }
  return 1;
}

/* core.signal_number(name) -> the number of the signal named name. */
static int proc_signal_number(lua_State *L) {
  lua_pushinteger(L, signals[check_signal(L, 1)].signo);
  return 1;
}

/* core.hostname() -> this machine's host name ("" when it has none). */
static int proc_hostname(lua_State *L) {
  char name[256];
  if (gethostname(name, sizeof name) != 0) name[0] = '\0';
  name[sizeof name - 1] = '\0';
  lua_pushstring(L, name);
  return 1;
}

/* core.getpid() -> this process's id. */
static int proc_getpid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getpid());
  return 1;
}

static const luaL_Reg proc_functions[] = {
  { "spawn", proc_spawn },
  { "reap", proc_reap },
  { "kill", proc_kill },
  { "trap", proc_trap },
  { "trapped", proc_trapped },
  { "signal_number", proc_signal_number },
  { "getpid", proc_getpid },
  { "hostname", proc_hostname },
  { NULL, NULL }
};

void rl_proc_register(lua_State *L) {
  luaL_setfuncs(L, proc_functions, 0);
}
