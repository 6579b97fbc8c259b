/* SPDX-License-Identifier: MIT */
/* What the core asks of the system: tokens from OS randomness (and forks,
   which must not share them), and the monotonic clock. */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* getrandom, O_CLOEXEC under -std=c99 */
#endif
#include "rl_proto.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/random.h>
#endif

/* Fills buf with OS randomness: getrandom(2) where it exists, else /dev/urandom. */
static int os_random(unsigned char *buf, size_t n) {
  size_t got = 0;
#ifdef __linux__
  while (got < n) {
    ssize_t r = getrandom(buf + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == ENOSYS) break;
      return -1;
    }
    got += (size_t)r;
  }
  if (got == n) return 0;
#endif
  {
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    while (got < n) {
      ssize_t r = read(fd, buf + got, n - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) { close(fd); if (r == 0) errno = EIO; return -1; }
      got += (size_t)r;
    }
    close(fd);
  }
  return 0;
}

/* Counts fork()s in this process's line: a child sees a new value. */
static unsigned fork_gen;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
/* The random pool's mutex is held across fork(), so the child never inherits
   it locked by a thread that does not exist there. */
static void lock_pool(void) { pthread_mutex_lock(&pool_mu); }
static void unlock_pool(void) { pthread_mutex_unlock(&pool_mu); }
static void count_fork(void) {
  fork_gen++;
  pthread_mutex_unlock(&pool_mu);
}
static void watch_forks(void) { pthread_atfork(lock_pool, unlock_pool, count_fork); }

unsigned rl_fork_gen(void) {
  pthread_once(&fork_once, watch_forks);
  return fork_gen;
}

/*
 * OS randomness is read RANDOM_BATCH bytes at a time (one system call for
 * 256 tokens: a lock cycle's other calls are its two round trips' send and
 * read). The batch is never used twice, nor by a forked child, which would
 * otherwise hand out its parent's next tokens.
 */
#define RANDOM_BATCH (256 * RL_TOKEN_BYTES)
static struct {
  unsigned char bytes[RANDOM_BATCH];
  size_t used; /* bytes already handed out; RANDOM_BATCH when empty */
  unsigned gen;
} pool = { { 0 }, RANDOM_BATCH, 0 }; /* guarded by pool_mu */

static int take_random(unsigned char *out, size_t len) {
  unsigned gen = rl_fork_gen();
  int rc = 0;
  pthread_mutex_lock(&pool_mu);
  if (pool.gen != gen) pool.used = RANDOM_BATCH; /* a fork: drop the parent's batch */
  pool.gen = gen;
  if (pool.used + len > RANDOM_BATCH) {
    rc = os_random(pool.bytes, RANDOM_BATCH);
    pool.used = rc == 0 ? 0 : RANDOM_BATCH;
  }
  if (rc == 0) {
    memcpy(out, pool.bytes + pool.used, len);
    memset(pool.bytes + pool.used, 0, len);
    pool.used += len;
  }
  pthread_mutex_unlock(&pool_mu);
  return rc;
}

int rl_token(char out[RL_TOKEN_HEX + 1]) {
  static const char digits[] = "0123456789abcdef";
  unsigned char raw[RL_TOKEN_BYTES];
  int i;
  if (take_random(raw, sizeof raw) != 0) return -1;
  for (i = 0; i < RL_TOKEN_BYTES; i++) {
    out[2 * i] = digits[raw[i] >> 4];
    out[2 * i + 1] = digits[raw[i] & 15];
  }
  out[RL_TOKEN_HEX] = '\0';
  return 0;
}

long long rl_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
