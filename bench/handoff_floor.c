/* SPDX-License-Identifier: MIT */
/*
 * bench/handoff_floor.c: the floor for a wake-up, for `make bench` (a
 * benchmark, not a test): a raw C pair handing off through RPUSH/BLPOP.
 *
 *   handoff_floor PORT ROUNDS HOLD_MS WAITER_CPU
 *
 * A waiter process (forked, moved to core WAITER_CPU) blocks in BLPOP on a
 * list; the waker (this process, wherever it was started: bench/handoff.lua
 * starts it on the server's core, as its holder) waits a random 5..HOLD_MS ms
 * (so that the waiter is blocked), reads CLOCK_MONOTONIC, sends RPUSH; the
 * waiter reads the clock as soon as BLPOP's reply is in and sends the reading
 * back over a pipe. Latency = the two readings' difference: what the wake-up
 * itself costs, with no lock scripts, no library and no retry. Prints
 * "p50_us=<n> p99_us=<n>"; on a failure prints why on stderr and exits 1.
 */
#define _GNU_SOURCE /* sched_setaffinity */

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int connect_to(int port) {
  struct sockaddr_in a;
  int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    perror("handoff_floor: connect");
    exit(1);
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

/* Sends s, then reads until a reply ending in "\r\n" with `lines` lines is in. */
static void round_trip(int fd, const char *s, int lines) {
  char buf[512];
  size_t got = 0;
  int seen = 0;
  if (write(fd, s, strlen(s)) != (ssize_t)strlen(s)) {
    perror("handoff_floor: write");
    exit(1);
  }
  while (seen < lines) {
    ssize_t n = read(fd, buf + got, sizeof buf - got);
    if (n <= 0) {
      fprintf(stderr, "handoff_floor: the server closed the connection\n");
      exit(1);
    }
    for (ssize_t i = 0; i < n; i++)
      if (buf[got + (size_t)i] == '\n') seen++;
    got += (size_t)n;
    if (buf[0] == '-') {
      fprintf(stderr, "handoff_floor: %.*s\n", (int)got, buf);
      exit(1);
    }
    if (got == sizeof buf) got = 0;
  }
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  static const char blpop[] = "*3\r\n$5\r\nBLPOP\r\n$19\r\nbench:handoff-floor\r\n$1\r\n0\r\n";
  static const char rpush[] = "*3\r\n$5\r\nRPUSH\r\n$19\r\nbench:handoff-floor\r\n$1\r\n1\r\n";
  int port, rounds, hold_ms, cpu, pipes[2];
  double *lat;
  pid_t pid;
  if (argc != 5) {
    fprintf(stderr, "usage: handoff_floor PORT ROUNDS HOLD_MS WAITER_CPU\n");
    return 2;
  }
  port = atoi(argv[1]), rounds = atoi(argv[2]), hold_ms = atoi(argv[3]), cpu = atoi(argv[4]);
  if (rounds < 1 || hold_ms < 5 || pipe(pipes) != 0) return 2;
  pid = fork();
  if (pid == 0) { /* the waiter */
    cpu_set_t set;
    int fd = connect_to(port);
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
    for (int i = 0; i < rounds; i++) {
      double t;
      round_trip(fd, blpop, 5); /* *2, $19, key, $1, 1 */
      t = now_us();
      if (write(pipes[1], &t, sizeof t) != sizeof t) _exit(1);
    }
    _exit(0);
  }
  lat = (double *)calloc((size_t)rounds, sizeof *lat);
  {
    int fd = connect_to(port);
    srand((unsigned)getpid());
    for (int i = 0; i < rounds; i++) {
      struct timespec hold;
      double t0, t1;
      long us = 5000 + rand() % ((hold_ms - 5) * 1000 + 1);
      hold.tv_sec = 0;
      hold.tv_nsec = us * 1000;
      nanosleep(&hold, NULL);
      t0 = now_us();
      round_trip(fd, rpush, 1);
      if (read(pipes[0], &t1, sizeof t1) != sizeof t1) {
        fprintf(stderr, "handoff_floor: the waiter went away\n");
        return 1;
      }
      lat[i] = t1 - t0;
    }
  }
  waitpid(pid, NULL, 0);
  qsort(lat, (size_t)rounds, sizeof *lat, cmp);
  printf("p50_us=%.1f p99_us=%.1f\n", lat[rounds / 2], lat[(rounds * 99) / 100 < rounds ? (rounds * 99) / 100 : rounds - 1]);
  free(lat);
  return 0;
}
