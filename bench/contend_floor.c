/* SPDX-License-Identifier: MIT */
/*
 * bench/contend_floor.c: contended throughput with no Lua and no library,
 * for `make bench` (a benchmark, not a test): PROCS processes on one key
 * for SECONDS, each looping over an acquisition of the lock (handed over), the
 * section of bench/contend.lua (INCR, GET, SET n+1, DECR) and a release,
 * through raw sockets.
 *
 *   contend_floor PORT PROCS SECONDS minimal
 *   contend_floor PORT PROCS SECONDS scripts ACQUIRE_WAIT_FILE RELEASE_FILE
 *
 * "minimal": the smallest handoff there is: a try script (SET NX PX and
 * INCR of the fence; or RPUSH of the token on a queue list) then BLPOP on
 * the waiter's own list; the release script checks the token, pops the
 * queue's head and hands it the lock (SET with its token, INCR, RPUSH of
 * the fence on its list). No clock in the fence (a counter's INCR), no
 * liveness, no take-back.
 * "scripts": redislock's own acquire_wait and release (their text in the
 * two files; bench/contend.lua writes them from redislock.core's), with
 * the keys and arguments the library sends (the slot's fence record here
 * under the lock's own tag, which costs the same), and the waiter's BLPOP
 * of a second at most, as a registered waiter's. What either makes is how
 * far a handoff goes on this machine without the library's client around
 * it.
 * Prints "rate=<acquisitions/s> violations=<n>" (overlaps seen, and the
 * counter's distance from the acquisitions made); exits 1 on a failure.
 */
#define _GNU_SOURCE /* clock_gettime with -std=c99 */

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char MIN_TRY[] =
  "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then\n"
  "  return redis.call('INCR', KEYS[1] .. ':fence')\n"
  "end\n"
  "redis.call('RPUSH', KEYS[2], ARGV[1])\n"
  "return -1\n";

static const char MIN_RELEASE[] =
  "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end\n"
  "local heir = redis.call('LPOP', KEYS[2])\n"
  "if heir then\n"
  "  local f = redis.call('INCR', KEYS[1] .. ':fence')\n"
  "  redis.call('SET', KEYS[1], heir, 'PX', ARGV[2])\n"
  "  redis.call('RPUSH', KEYS[1] .. ':signal:' .. heir, f)\n"
  "  return 2\n"
  "end\n"
  "redis.call('DEL', KEYS[1])\n"
  "return 1\n";

#define LOCK "bench:{floor}"

/* One connection and its read buffer. */
typedef struct {
  int fd;
  char buf[65536];
  size_t len, pos;
} conn;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what) {
  fprintf(stderr, "contend_floor: %s\n", what);
  exit(1);
}

static void open_conn(conn *c, int port) {
  struct sockaddr_in a;
  int one = 1;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  c->fd = socket(AF_INET, SOCK_STREAM, 0);
  if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&a, sizeof a) != 0) die("cannot connect");
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  c->len = c->pos = 0;
}

/* Reads more of the replies, after what is unread (moved to the front). */
static void fill(conn *c) {
  ssize_t n;
  if (c->pos > 0) {
    memmove(c->buf, c->buf + c->pos, c->len - c->pos);
    c->len -= c->pos;
    c->pos = 0;
  }
  if (c->len == sizeof c->buf) die("reply too long");
  n = read(c->fd, c->buf + c->len, sizeof c->buf - c->len);
  if (n <= 0) die("connection lost");
  c->len += (size_t)n;
}

/* The next line of a reply (its "\r\n" cut off), reading as needed. */
static char *next_line(conn *c) {
  for (;;) {
    char *end = memchr(c->buf + c->pos, '\n', c->len - c->pos);
    if (end != NULL) {
      char *line = c->buf + c->pos;
      end[-1] = '\0';
      c->pos = (size_t)(end - c->buf) + 1;
      return line;
    }
    fill(c);
  }
}

/* Reads one reply: an integer's value, a bulk's length (its bytes, up to
   cap - 1, in out), an array's count (its last element in out), -1 for a
   nil. An error reply ends the run. */
static long long read_reply(conn *c, char *out, size_t cap) {
  char *line = next_line(c);
  long long v = atoll(line + 1), i;
  if (line[0] == '-') {
    fprintf(stderr, "contend_floor: redis: %s\n", line + 1);
    exit(1);
  }
  if (line[0] == '$' && v >= 0) {
    while (c->len - c->pos < (size_t)v + 2) fill(c);
    if (out != NULL && cap > 0) {
      size_t k = (size_t)v < cap - 1 ? (size_t)v : cap - 1;
      memcpy(out, c->buf + c->pos, k);
      out[k] = '\0';
    }
    c->pos += (size_t)v + 2;
    return v;
  }
  if (line[0] == '*')
    for (i = 0; i < v; i++) read_reply(c, out, cap);
  return line[0] == '+' ? 0 : v;
}

/* Sends one command of argc arguments; returns its reply as read_reply. */
static long long call(conn *c, int argc, const char *const *argv, char *out, size_t cap) {
  static char cmd[65536];
  size_t n = (size_t)snprintf(cmd, sizeof cmd, "*%d\r\n", argc);
  int i;
  for (i = 0; i < argc; i++) {
    size_t len = strlen(argv[i]);
    if (n + len + 32 > sizeof cmd) die("command too long");
    n += (size_t)snprintf(cmd + n, sizeof cmd - n, "$%zu\r\n", len);
    memcpy(cmd + n, argv[i], len);
    memcpy(cmd + n + len, "\r\n", 2);
    n += len + 2;
  }
  if (write(c->fd, cmd, n) != (ssize_t)n) die("write failed");
  return read_reply(c, out, cap);
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  static char text[2][16384];
  static int k;
  char *t = text[k++ % 2];
  size_t n;
  if (f == NULL) die("cannot read a script file");
  n = fread(t, 1, sizeof text[0] - 1, f);
  t[n] = '\0';
  fclose(f);
  return t;
}

/* One process's loop: writes "<acquired in the window> <in all> <overlaps>" to out. */
static void worker(int port, int scripts, const char *try_sha, const char *release_sha, double start,
                   double stop, int out) {
  conn c;
  char tok[40], own[128], o[256], msg[64];
  long acquired = 0, all = 0, overlaps = 0;
  int k;
  open_conn(&c, port);
  snprintf(tok, sizeof tok, "%08x%08x%016x", (unsigned)getpid(), (unsigned)rand(), 0u);
  snprintf(own, sizeof own, LOCK ":signal:%s", tok);
  while (now_s() < start) usleep(1000);
  while (now_s() < stop) {
    long long n;
    char next[32];
    for (;;) { /* until the lock is ours: taken at once, or handed over */
      if (scripts) {
        const char *a[] = { "EVALSHA", try_sha, "4", LOCK, LOCK ":fence", LOCK ":handoff", LOCK ":era",
                            tok, "10000", "10000", "3000" };
        if (call(&c, 11, a, NULL, 0) > 0) break;
      } else {
        const char *a[] = { "EVALSHA", try_sha, "2", LOCK, LOCK ":queue", tok, "10000" };
        if (call(&c, 7, a, NULL, 0) > 0) break;
      }
      {
        const char *b[] = { "BLPOP", own, scripts ? "1" : "10" };
        if (call(&c, 3, b, o, sizeof o) > 0) break;
      }
    }
    {
      const char *a[] = { "INCR", LOCK ":inside" };
      if (call(&c, 2, a, NULL, 0) > 1) overlaps++;
    }
    {
      const char *a[] = { "GET", LOCK ":counter" };
      call(&c, 2, a, o, sizeof o);
    }
    n = atoll(o);
    snprintf(next, sizeof next, "%lld", n + 1);
    {
      const char *a[] = { "SET", LOCK ":counter", next };
      call(&c, 3, a, NULL, 0);
    }
    {
      const char *a[] = { "DECR", LOCK ":inside" };
      call(&c, 2, a, NULL, 0);
    }
    if (scripts) {
      const char *a[] = { "EVALSHA", release_sha, "8", LOCK, LOCK ":signal", LOCK ":queue", LOCK ":hand",
                          LOCK ":waiters", LOCK ":fence", LOCK ":era", LOCK ":handoff", tok };
      if (call(&c, 12, a, NULL, 0) != 1) die("a release found the lock not ours");
    } else {
      const char *a[] = { "EVALSHA", release_sha, "2", LOCK, LOCK ":queue", tok, "10000" };
      if (call(&c, 7, a, NULL, 0) < 1) die("a release found the lock not ours");
    }
    all++;
    if (now_s() <= stop) acquired++;
  }
  k = snprintf(msg, sizeof msg, "%ld %ld %ld\n", acquired, all, overlaps);
  if (write(out, msg, (size_t)k) != k) die("cannot report");
}

int main(int argc, char **argv) {
  conn c;
  char try_sha[64], release_sha[64], counter[64];
  int port, procs, scripts, i, pipefd[2];
  double seconds, start;
  long total = 0, all = 0, overlaps = 0, a, b, o;
  FILE *results;
  if (argc < 5 || (strcmp(argv[4], "minimal") != 0 && (strcmp(argv[4], "scripts") != 0 || argc != 7))) {
    fprintf(stderr, "usage: contend_floor PORT PROCS SECONDS minimal\n"
                    "       contend_floor PORT PROCS SECONDS scripts ACQUIRE_WAIT_FILE RELEASE_FILE\n");
    return 2;
  }
  port = atoi(argv[1]);
  procs = atoi(argv[2]);
  seconds = atof(argv[3]);
  scripts = strcmp(argv[4], "scripts") == 0;
  if (procs < 1 || seconds <= 0) die("PROCS and SECONDS must be positive");
  open_conn(&c, port);
  {
    const char *l1[] = { "SCRIPT", "LOAD", scripts ? slurp(argv[5]) : MIN_TRY };
    const char *l2[] = { "SCRIPT", "LOAD", scripts ? slurp(argv[6]) : MIN_RELEASE };
    const char *d[] = { "DEL", LOCK, LOCK ":queue", LOCK ":handoff", LOCK ":inside" };
    const char *s[] = { "SET", LOCK ":counter", "0" };
    call(&c, 3, l1, try_sha, sizeof try_sha);
    call(&c, 3, l2, release_sha, sizeof release_sha);
    call(&c, 5, d, NULL, 0);
    call(&c, 3, s, NULL, 0);
  }
  if (pipe(pipefd) != 0) die("pipe failed");
  start = now_s() + 0.3 + 0.02 * procs; /* every process connected by then */
  for (i = 0; i < procs; i++) {
    pid_t pid = fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
      srand((unsigned)getpid());
      close(pipefd[0]);
      worker(port, scripts, try_sha, release_sha, start, start + seconds, pipefd[1]);
      _exit(0);
    }
  }
  close(pipefd[1]);
  results = fdopen(pipefd[0], "r");
  if (results == NULL) die("fdopen failed");
  while (fscanf(results, "%ld %ld %ld", &a, &b, &o) == 3) total += a, all += b, overlaps += o;
  fclose(results);
  for (i = 0; i < procs; i++) {
    int status;
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) die("a worker failed");
  }
  {
    const char *g[] = { "GET", LOCK ":counter" };
    call(&c, 2, g, counter, sizeof counter);
  }
  printf("rate=%.0f violations=%ld\n", (double)total / seconds, overlaps + labs(atol(counter) - all));
  return 0;
}
