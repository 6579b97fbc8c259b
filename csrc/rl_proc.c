/* SPDX-License-Identifier: MIT */
/*
 * Processes, for the `redislock` command (bin/redislock): start a command
 * under a keeper, look at how it ended, send it signals, and catch the
 * signals sent to us so that they can be passed on. Nothing here is about
 * locks; the command's Lua code does the locking.
 *
 * The keeper. A command must not run on once the `redislock` that took its
 * lock is gone, whatever ended it (SIGKILL, the OOM killer): the lock runs
 * out by its TTL and another holder's command starts. So the command is
 * not our child but our keeper's: core.spawn forks a keeper that forks and
 * runs the command, and watches a pipe whose other end only we hold. A
 * byte on it is a signal to pass on to the command; the end of it (we are
 * gone: the kernel closes a dead process's files, whatever killed it) is
 * TERM to the command, then KILL after the time given to core.spawn. The
 * keeper ends as the command did (its exit status, or the same signal), so
 * core.reap of the keeper tells how the command ended. The pipe works on
 * every POSIX system; on Linux the command also gets PR_SET_PDEATHSIG
 * SIGKILL from the keeper (a process of one thread: the signal is tied to
 * the thread that forked, here the keeper's only one), so a keeper killed
 * itself takes the command with it at once.
 *
 * We may run threads (the watchdog): between fork and exec, and in the
 * keeper, only async-signal-safe calls are made (fork, execve, waitpid,
 * poll, read, kill, sigaction, nanosleep, clock_gettime, _exit); the path
 * of the command is found before the fork.
 */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* environ, under -std=c99 */
#endif
#include "rl_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

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

/* The keeper of the command started last, and the end of its pipe we
   write to (-1: none). */
static pid_t keeper_pid = 0;
static int keeper_fd = -1;

/* In the keeper: the command's pid, for the signal handler. */
static pid_t job_pid = 0;

/* The keeper passes a signal sent to it on to the command. */
static void pass_on(int signo) {
  int saved = errno;
  if (job_pid > 0) kill(job_pid, signo);
  errno = saved;
}

/* The keeper's handler of SIGCHLD: only to end its poll at once. */
static void child_ended(int signo) {
  (void)signo;
}

static long long mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The keeper ends as the command did (status: waitpid's): with its exit
   status, or killed by its signal (no core file of the keeper's own). */
static void end_as(int status) {
  sigset_t set;
  int sig;
  struct rlimit none = { 0, 0 };
  if (!WIFSIGNALED(status)) _exit(WEXITSTATUS(status));
  sig = WTERMSIG(status);
  setrlimit(RLIMIT_CORE, &none);
  signal(sig, SIG_DFL);
  sigemptyset(&set);
  sigaddset(&set, sig);
  sigprocmask(SIG_UNBLOCK, &set, NULL);
  kill(getpid(), sig);
  _exit(128 + sig);
}

/* The keeper, in the child of core.spawn's fork: runs the command (path,
   argv, envp) as its child, and passes on what comes on fd until it ends;
   when fd ends, TERM, then KILL orphan_ms later. Never returns. */
static void keep(int fd, const char *path, char *const *argv, char *const *envp, long long orphan_ms) {
  static const int passed[] = { SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM };
  sigset_t all, none;
  struct sigaction sa;
  pid_t me = getpid();
  unsigned char buf[64];
  int status, s;
  sigfillset(&all);
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &all, NULL);
#ifdef __linux__
  prctl(PR_SET_NAME, "redislock-keep", 0, 0, 0);
#endif
  job_pid = fork();
  if (job_pid == 0) {
    for (s = 1; s < NSIG; s++) signal(s, SIG_DFL); /* an ignored signal stays ignored across exec */
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (getppid() != me) _exit(126); /* the keeper died before that: so do we */
#endif
    close(fd);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(path, argv, envp);
    _exit(errno == ENOENT ? 127 : 126);
  }
  if (job_pid < 0) _exit(126);
  memset(&sa, 0, sizeof sa);
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = pass_on; /* no SA_RESTART: a signal ends the poll below */
  for (s = 0; s < (int)(sizeof passed / sizeof passed[0]); s++) sigaction(passed[s], &sa, NULL);
  sa.sa_handler = child_ended;
  sigaction(SIGCHLD, &sa, NULL);
  sa.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &sa, NULL);
  sigprocmask(SIG_SETMASK, &none, NULL);
  for (;;) {
    struct pollfd p;
    ssize_t n, i;
    if (waitpid(job_pid, &status, WNOHANG) == job_pid) end_as(status);
    p.fd = fd, p.events = POLLIN, p.revents = 0;
    if (poll(&p, 1, 50) <= 0) continue; /* time, a signal, or the command ended */
    n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break; /* the end: whoever started us is gone */
    for (i = 0; i < n; i++) kill(job_pid, buf[i]);
  }
  /* Orphaned: the lock runs out by its TTL; the command stops before. */
  kill(job_pid, SIGTERM);
  {
    long long until = mono_ms() + orphan_ms;
    while (mono_ms() < until) {
      struct timespec tick = { 0, 10 * 1000000L };
      if (waitpid(job_pid, &status, WNOHANG) == job_pid) end_as(status);
      nanosleep(&tick, NULL);
    }
  }
  kill(job_pid, SIGKILL);
  while (waitpid(job_pid, &status, 0) < 0 && errno == EINTR) {}
  end_as(status);
}

/* The file the command name runs (looked up in PATH as a shell does when
   it has no '/'), written into out (cap bytes): 0, or an errno (ENOENT, or
   EACCES when only files that cannot be run were found). */
static int find_command(const char *name, char *out, size_t cap) {
  const char *path = getenv("PATH"), *p, *end;
  int found_other = 0;
  struct stat st;
  if (*name == '\0') return ENOENT;
  if (strchr(name, '/') != NULL) {
    if (strlen(name) >= cap) return ENAMETOOLONG;
    strcpy(out, name);
    if (access(out, F_OK) != 0) return errno;
    return access(out, X_OK) == 0 ? 0 : EACCES;
  }
  if (path == NULL) path = "/usr/local/bin:/usr/bin:/bin";
  for (p = path;; p = end + 1) {
    size_t dlen;
    end = strchr(p, ':');
    if (end == NULL) end = p + strlen(p);
    dlen = (size_t)(end - p);
    if (dlen + 1 + strlen(name) < cap) {
      if (dlen == 0) {
        strcpy(out, name); /* an empty entry: the current folder */
      } else {
        memcpy(out, p, dlen);
        out[dlen] = '/';
        strcpy(out + dlen + 1, name);
      }
      if (stat(out, &st) == 0 && S_ISREG(st.st_mode)) {
        if (access(out, X_OK) == 0) return 0;
        found_other = 1;
      }
    }
    if (*end == '\0') break;
  }
  return found_other ? EACCES : ENOENT;
}

/*
 * core.spawn(argv, env[, orphan]) -> pid | nil, err, errno
 * Starts argv[1] (looked up in PATH as a shell would) with argv as its
 * arguments, in our environment plus env's NAME = value pairs, with every
 * signal at its default and none blocked, under a keeper (see the top of
 * this file): pid is the keeper's, which core.kill and core.reap take as
 * the command's. When this process ends before the command, the command
 * gets TERM, and KILL orphan seconds later (default 5) if it still runs.
 * On failure (not found, not executable) nil, a message and the errno.
 */
static int proc_spawn(lua_State *L) {
  size_t n, i, nenv = 0, extra = 0;
  char **argv, **envp, path[PATH_MAX];
  long long orphan_ms = 5000;
  pid_t pid;
  int rc, fds[2];
  luaL_checktype(L, 1, LUA_TTABLE);
  if (!lua_isnoneornil(L, 3)) {
    lua_Number orphan = luaL_checknumber(L, 3);
    luaL_argcheck(L, orphan >= 0 && orphan <= 86400 * 365, 3, "orphan must be seconds from 0 to a year");
    orphan_ms = (long long)(orphan * 1000 + 0.5);
  }
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
  if ((rc = find_command(argv[0], path, sizeof path)) != 0) goto failed;
  if (pipe(fds) != 0) {
    rc = errno;
    goto failed;
  }
  fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  fcntl(fds[1], F_SETFD, FD_CLOEXEC);
  pid = fork();
  if (pid == 0) {
    close(fds[1]);
    keep(fds[0], path, argv, envp, orphan_ms);
  }
  rc = errno;
  close(fds[0]);
  if (pid < 0) {
    close(fds[1]);
    goto failed;
  }
  if (keeper_fd >= 0) close(keeper_fd); /* an earlier keeper's, never reaped */
  keeper_pid = pid;
  keeper_fd = fds[1];
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
  if (r == keeper_pid) { /* the keeper ended as its command did */
    if (keeper_fd >= 0) close(keeper_fd);
    keeper_fd = -1;
    keeper_pid = 0;
  }
  if (WIFSIGNALED(status)) {
    lua_pushliteral(L, "signaled");
    lua_pushinteger(L, WTERMSIG(status));
  } else {
    lua_pushliteral(L, "exited");
    lua_pushinteger(L, WEXITSTATUS(status));
  }
  return 2;
}

/* Asks the keeper to send signo to its command: 0, or an errno (ESRCH
   when the keeper is gone). SIGPIPE, which a write to a pipe nobody reads
   raises, is held back and taken, so that it cannot end this process. */
static int tell_keeper(int signo) {
  unsigned char b = (unsigned char)signo;
  sigset_t pipe_only, old;
  struct timespec zero = { 0, 0 };
  ssize_t n;
  int err;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
  do n = write(keeper_fd, &b, 1);
  while (n < 0 && errno == EINTR);
  err = n == 1 ? 0 : errno == EPIPE ? ESRCH : errno;
  if (n < 0 && errno == EPIPE) sigtimedwait(&pipe_only, NULL, &zero);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return err;
}

/* core.kill(pid, name) -> true | nil, err: sends the signal named name
   ("TERM" ...); to the command, when pid is its keeper's. */
static int proc_kill(lua_State *L) {
  lua_Integer pid = luaL_checkinteger(L, 1);
  size_t s = check_signal(L, 2);
  luaL_argcheck(L, pid > 0, 1, "pid must be > 0");
  if (pid == keeper_pid && keeper_fd >= 0) {
    int err = tell_keeper(signals[s].signo);
    if (err == 0) {
      lua_pushboolean(L, 1);
      return 1;
    }
    lua_pushnil(L);
    lua_pushstring(L, strerror(err));
    return 2;
  }
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
