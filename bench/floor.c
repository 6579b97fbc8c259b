/* SPDX-License-Identifier: MIT */
/*
 * bench/floor.c: the raw-socket floor for `make bench` (a benchmark, not a test).
 *
 *   floor PORT CYCLES FIRST_FILE SECOND_FILE [FIRST_REPLIES]
 *
 * Sends the bytes of FIRST_FILE, then those of SECOND_FILE, to 127.0.0.1:PORT,
 * CYCLES times, over one TCP connection (TCP_NODELAY, as hiredis sets it):
 * one write per file, then reads until the whole RESP reply is in (or the
 * FIRST_REPLIES replies, default 1, to FIRST_FILE: more for a transaction,
 * MULTI's, each QUEUED and EXEC's, as the library's take is answered). No
 * library, no pipelining, no event loop: what is left is the two round
 * trips themselves. The files hold the exact bytes the library sends
 * (bench/benchlib.lua's floor writes them with core.encode_script), so the
 * floor always sends what the library sends.
 *
 * With FLOOR_SOCKET=library in the environment, its socket is set up as the
 * library's connection (csrc/rl_conn.c): the read and write timeouts of a
 * call (SO_RCVTIMEO, SO_SNDTIMEO: 1 s, the default), TCP keepalive as
 * hiredis sets it, send with MSG_NOSIGNAL and recv of at most 16 KiB: the
 * same system calls and socket as the library's cycle (bench/split.lua).
 *
 * Every reply must say "done": an error reply, a nil, an integer <= 0 or an
 * array whose first element is an integer <= 0 or a nil (the lock scripts'
 * "busy" and "not ours", a transaction's first command that answered nil)
 * stops the run, so a cycle that took a shortcut cannot pass for a fast
 * one. Prints "cycles_per_s=<rate>" for the timed loop (connecting is not
 * timed) and exits 0; on any failure prints why on stderr and exits 1.
 */
#define _POSIX_C_SOURCE 200809L

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define REPLY_MAX 65536
#define LIB_READ 16384 /* the library's reads (rl_conn.c) */

static int like_library; /* FLOOR_SOCKET=library */

typedef struct {
  char *bytes;
  size_t len;
  int replies; /* answered with this many replies */
} command;

static void die(const char *what) {
  fprintf(stderr, "floor: %s\n", what);
  exit(1);
}

static void die_errno(const char *what) {
  fprintf(stderr, "floor: %s: %s\n", what, strerror(errno));
  exit(1);
}

/* Reads the whole file at path into cmd; exits on failure. */
static void read_command(const char *path, command *cmd) {
  FILE *f = fopen(path, "rb");
  long size = -1;
  if (f == NULL) die_errno(path);
  if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  if (size <= 0 || fseek(f, 0, SEEK_SET) != 0) die("cannot size a command file (empty?)");
  cmd->bytes = malloc((size_t)size);
  if (cmd->bytes == NULL) die("out of memory");
  if (fread(cmd->bytes, 1, (size_t)size, f) != (size_t)size) die_errno(path);
  fclose(f);
  cmd->len = (size_t)size;
}

/* A connected TCP socket to 127.0.0.1:port with TCP_NODELAY; exits on failure. */
static int connect_to(int port) {
  struct sockaddr_in addr;
  int one = 1;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die_errno("socket");
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_port = htons((unsigned short)port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) die_errno("connect");
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) die_errno("TCP_NODELAY");
  if (like_library) {
    struct timeval tv = { 1, 0 };
    int idle = 15, intvl = 5, cnt = 3;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt) != 0)
      die_errno("the library's socket options");
  }
  return fd;
}

/*
 * The end of the line that starts at p (the position after its "\r\n"), or
 * NULL when the line is not complete before end.
 */
static const char *line_end(const char *p, const char *end) {
  for (; p + 1 < end; p++)
    if (p[0] == '\r' && p[1] == '\n') return p + 2;
  return NULL;
}

/*
 * Parses one RESP value at p. Returns the position after it, or NULL when the
 * buffer does not hold all of it yet. Sets *num to the value of an integer
 * reply and *kind to its type byte; a nil (bulk or array of length -1) sets
 * *kind to '0'. Of an array, *num and *kind are those of its first element.
 */
static const char *parse(const char *p, const char *end, long long *num, char *kind) {
  const char *next = line_end(p, end);
  long long n;
  if (next == NULL) return NULL;
  *kind = p[0];
  n = strtoll(p + 1, NULL, 10);
  switch (p[0]) {
  case '+':
  case '-':
    return next;
  case ':':
    *num = n;
    return next;
  case '$':
    if (n < 0) {
      *kind = '0';
      return next;
    }
    return end - next >= n + 2 ? next + n + 2 : NULL;
  case '*': {
    long long i;
    if (n < 0) *kind = '0';
    for (i = 0; i < n && next != NULL; i++) {
      long long inner_num = 0;
      char inner_kind = 0;
      next = parse(next, end, &inner_num, &inner_kind);
      if (i == 0) {
        *num = inner_num;
        *kind = inner_kind;
      }
    }
    return next;
  }
  default:
    die("the server sent something that is not RESP");
    return NULL;
  }
}

/* Sends cmd in one write and reads its whole reply (all its replies); exits
   unless each says "done". */
static void round_trip(int fd, const command *cmd, char *buf) {
  size_t have = 0;
  long long num = 1;
  char kind = 0, bad = 0; /* the first reply that is not "done" */
  ssize_t n = like_library ? send(fd, cmd->bytes, cmd->len, MSG_NOSIGNAL) : write(fd, cmd->bytes, cmd->len);
  if (n != (ssize_t)cmd->len) die_errno("write");
  for (;;) {
    const char *p = buf;
    int i;
    size_t room = REPLY_MAX - have;
    n = like_library ? recv(fd, buf + have, room < LIB_READ ? room : LIB_READ, 0) : read(fd, buf + have, room);
    if (n <= 0) die(n == 0 ? "the server closed the connection" : strerror(errno));
    have += (size_t)n;
    for (i = 0; i < cmd->replies && p != NULL; i++) {
      p = parse(p, buf + have, &num, &kind);
      if (p != NULL && (kind == '-' || kind == '0' || (kind == ':' && num <= 0)) && bad == 0) bad = kind;
    }
    if (p != NULL) break;
    bad = 0;
    if (have == REPLY_MAX) die("reply too long");
  }
  if (bad == '-') {
    fprintf(stderr, "floor: the server answered an error: %.*s\n", (int)have, buf);
    exit(1);
  }
  if (bad != 0) {
    fprintf(stderr, "floor: a command did not succeed (nil, 0 or busy); reply: %.*s\n", (int)have, buf);
    exit(1);
  }
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  command first, second;
  static char buf[REPLY_MAX];
  long cycles, i;
  int port, fd;
  double t0, elapsed;
  const char *socket_kind;
  if (argc != 5 && argc != 6) die("usage: floor PORT CYCLES FIRST_FILE SECOND_FILE [FIRST_REPLIES]");
  port = atoi(argv[1]);
  cycles = atol(argv[2]);
  if (port <= 0 || port > 65535 || cycles <= 0) die("PORT and CYCLES must be positive numbers");
  read_command(argv[3], &first);
  read_command(argv[4], &second);
  first.replies = argc == 6 ? atoi(argv[5]) : 1;
  second.replies = 1;
  if (first.replies < 1 || first.replies > 16) die("FIRST_REPLIES must be 1 to 16");
  socket_kind = getenv("FLOOR_SOCKET");
  like_library = socket_kind != NULL && strcmp(socket_kind, "library") == 0;
  fd = connect_to(port);
  t0 = now();
  for (i = 0; i < cycles; i++) {
    round_trip(fd, &first, buf);
    round_trip(fd, &second, buf);
  }
  elapsed = now() - t0;
  close(fd);
  free(first.bytes);
  free(second.bytes);
  printf("cycles_per_s=%.1f\n", (double)cycles / elapsed);
  return 0;
}
