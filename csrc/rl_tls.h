/* SPDX-License-Identifier: MIT */
/*
 * TLS for the blocking transport, through OpenSSL: a shared, reference-counted
 * set of settings (trust anchors, client certificate, the name to check) made
 * once per client, and a handshake on a socket the transport owns, with a
 * deadline. Verification (chain and name) is on unless the user turned it off.
 * No Lua here, and nothing about Redis.
 */
#ifndef REDISLOCK_RL_TLS_H
#define REDISLOCK_RL_TLS_H

#include <stddef.h>
#include <sys/types.h>

#pragma GCC visibility push(hidden)

struct ssl_st; /* OpenSSL's SSL */

/* What the user asked for. NULL strings: not given. */
typedef struct {
  const char *ca;          /* PEM file of trust anchors, else the system store */
  const char *cert;        /* PEM client certificate (chain), with key */
  const char *key;         /* PEM private key of cert */
  const char *server_name; /* SNI and the name checked, else the host */
  int verify;              /* check chain and name (1), or neither (0) */
} rl_tls_opts;

typedef struct rl_tls rl_tls;

/*
 * Reads the files and builds the settings; no I/O but file reads. Returns
 * them, or NULL with a sentence in err naming the field at fault
 * ("tls.ca: cannot read ...", "tls.key does not match tls.cert").
 */
rl_tls *rl_tls_new(const rl_tls_opts *opts, char *err, size_t errlen);
/* Another reference (for a second connection, the watchdog's). Thread-safe. */
rl_tls *rl_tls_ref(rl_tls *tls);
/* Drops a reference; the last frees. NULL is ignored. Thread-safe. */
void rl_tls_unref(rl_tls *tls);
/* Whether two settings connect alike (same object, or both NULL). */
int rl_tls_same(const rl_tls *a, const rl_tls *b);

/*
 * Runs the client handshake on fd (connected, non-blocking) with host as the
 * name to check unless server_name was given, until deadline_ms (rl_now_ms
 * clock). Returns the session, or NULL with a "connection: ..." sentence in err
 * that says why (not trusted, name mismatch, not a TLS port, timed out). where
 * names the server for messages.
 */
struct ssl_st *rl_tls_handshake(rl_tls *tls, int fd, const char *host, const char *where,
                                long long deadline_ms, char *err, size_t errlen);

/*
 * Waits until fd is ready for events (POLLIN, POLLOUT) or deadline_ms
 * (rl_now_ms clock) passes, riding out EINTR: 1 ready, 0 out of time, -1
 * error. For the handshake here and the transport's connect.
 */
int rl_wait_fd(int fd, short events, long long deadline_ms);

/*
 * Reads or writes through the session, as read(2)/write(2) on a blocking
 * socket do: the count, 0 at a clean close (read), or -1 with errno set
 * (EAGAIN when the socket's timeout ran out). On a TLS-level failure, errno
 * is EPROTO and rl_tls_error describes it.
 */
ssize_t rl_tls_read(struct ssl_st *ssl, char *buf, size_t len);
ssize_t rl_tls_write(struct ssl_st *ssl, const char *buf, size_t len);
/* Whether the server asked for a client certificate that we did not have. */
int rl_tls_cert_requested(const struct ssl_st *ssl);
/* The bytes the session wrote on its socket so far (handshake and records). */
unsigned long long rl_tls_written(const struct ssl_st *ssl);
/* Whether the session holds bytes nobody read yet (decrypted or read ahead). */
int rl_tls_pending(const struct ssl_st *ssl);
/* After rl_tls_read/write set EPROTO: a sentence fragment, with a hint. */
void rl_tls_error(char *out, size_t len);
/* Frees the session (no close_notify is sent: the socket may be a parent's). */
void rl_tls_free(struct ssl_st *ssl);

#pragma GCC visibility pop

#endif
