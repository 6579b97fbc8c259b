/* SPDX-License-Identifier: MIT */
/* TLS through OpenSSL: settings, handshake with verification, reads and writes. */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* strdup under -std=c99 */
#endif
#include "rl_tls.h"
#include "rl_proto.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

struct rl_tls {
  SSL_CTX *ctx;
  char *server_name; /* or NULL: the host */
  int verify;
  int refs;
};

/*
 * A socket BIO of our own: OpenSSL's writes with write(2), and a write to a
 * connection the server reset raises SIGPIPE, which would end the user's Lua
 * process. send(MSG_NOSIGNAL) reports EPIPE instead. A signal that interrupts
 * a call is not a timeout: the call is made again.
 */
static BIO_METHOD *sock_method;
static pthread_once_t sock_once = PTHREAD_ONCE_INIT;

static int bio_fd(BIO *b) {
  return (int)(intptr_t)BIO_get_data(b);
}

static int sock_write(BIO *b, const char *buf, int len) {
  ssize_t n;
  do n = send(bio_fd(b), buf, (size_t)len, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  BIO_clear_retry_flags(b);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) BIO_set_retry_write(b);
  return (int)n;
}

static int sock_read(BIO *b, char *buf, int len) {
  ssize_t n;
  do n = recv(bio_fd(b), buf, (size_t)len, 0);
  while (n < 0 && errno == EINTR);
  BIO_clear_retry_flags(b);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) BIO_set_retry_read(b);
  return (int)n;
}

static long sock_ctrl(BIO *b, int cmd, long num, void *ptr) {
  (void)b, (void)num, (void)ptr;
  return cmd == BIO_CTRL_FLUSH ? 1 : 0; /* nothing is buffered here */
}

static void make_sock_method(void) {
  BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "redislock socket");
  if (m == NULL) return;
  BIO_meth_set_write(m, sock_write);
  BIO_meth_set_read(m, sock_read);
  BIO_meth_set_ctrl(m, sock_ctrl);
  sock_method = m; /* kept for the life of the process, as OpenSSL keeps its own */
}

/* A key file with a passphrase must fail, not prompt on the terminal. */
static int no_passphrase(char *buf, int size, int rwflag, void *u) {
  (void)buf, (void)size, (void)rwflag, (void)u;
  return 0;
}

/*
 * Called by OpenSSL when the server asks for a client certificate and none is
 * set: sends none, and marks the session, so that a refusal after the
 * handshake (TLS 1.3 sends it then) can be explained.
 */
static int no_client_cert(SSL *ssl, X509 **x509, EVP_PKEY **pkey) {
  (void)x509, (void)pkey;
  SSL_set_app_data(ssl, (void *)ssl);
  return 0;
}

int rl_tls_cert_requested(const struct ssl_st *ssl) {
  return SSL_get_app_data(ssl) != NULL;
}

/* The reason of OpenSSL's last error, or fallback. */
static const char *last_reason(const char *fallback) {
  const char *r = ERR_reason_error_string(ERR_peek_last_error());
  return r != NULL ? r : fallback;
}

/* Whether path can be opened for reading; else writes why into err. */
static int readable(const char *field, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    snprintf(err, errlen, "tls.%s: cannot read \"%s\": %s", field, path, strerror(errno));
    return 0;
  }
  fclose(f);
  return 1;
}

/* Loads the trust anchors and the client certificate into ctx; 0 or -1 and err. */
static int load_files(SSL_CTX *ctx, const rl_tls_opts *o, char *err, size_t errlen) {
  if (o->ca != NULL) {
    if (!readable("ca", o->ca, err, errlen)) return -1;
    if (SSL_CTX_load_verify_locations(ctx, o->ca, NULL) != 1) {
      snprintf(err, errlen, "tls.ca: \"%s\" holds no PEM certificate (%s)", o->ca,
               last_reason("unreadable"));
      return -1;
    }
  } else if (o->verify && SSL_CTX_set_default_verify_paths(ctx) != 1) {
    snprintf(err, errlen, "tls: cannot load the system's trust store (%s); give tls.ca",
             last_reason("unknown error"));
    return -1;
  }
  if (o->cert == NULL) return 0;
  if (!readable("cert", o->cert, err, errlen) || !readable("key", o->key, err, errlen)) return -1;
  if (SSL_CTX_use_certificate_chain_file(ctx, o->cert) != 1) {
    snprintf(err, errlen, "tls.cert: \"%s\" holds no PEM certificate (%s)", o->cert,
             last_reason("unreadable"));
    return -1;
  }
  ERR_clear_error();
  if (SSL_CTX_use_PrivateKey_file(ctx, o->key, SSL_FILETYPE_PEM) != 1) {
    if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH)
      snprintf(err, errlen, "tls.key \"%s\" does not match tls.cert \"%s\"", o->key, o->cert);
    else
      snprintf(err, errlen, "tls.key: \"%s\" holds no usable PEM private key (%s; a key with a"
               " passphrase is not supported)", o->key, last_reason("unreadable"));
    return -1;
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    snprintf(err, errlen, "tls.key \"%s\" does not match tls.cert \"%s\"", o->key, o->cert);
    return -1;
  }
  return 0;
}

rl_tls *rl_tls_new(const rl_tls_opts *o, char *err, size_t errlen) {
  rl_tls *t;
  pthread_once(&sock_once, make_sock_method);
  t = (rl_tls *)calloc(1, sizeof *t);
  if (t == NULL || sock_method == NULL) {
    free(t);
    snprintf(err, errlen, "tls: out of memory");
    return NULL;
  }
  t->refs = 1;
  t->verify = o->verify;
  ERR_clear_error();
  t->ctx = SSL_CTX_new(TLS_client_method());
  if (t->ctx == NULL || (o->server_name != NULL && (t->server_name = strdup(o->server_name)) == NULL)) {
    snprintf(err, errlen, "tls: cannot set up OpenSSL (%s)", last_reason("out of memory"));
    rl_tls_unref(t);
    return NULL;
  }
  SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
  /* A server that closes without close_notify (CLIENT KILL, a crash) reads as EOF. */
  SSL_CTX_set_options(t->ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  /* One recv(2) per reply instead of two (a record's header, then its body). */
  SSL_CTX_set_read_ahead(t->ctx, 1);
  SSL_CTX_set_default_passwd_cb(t->ctx, no_passphrase);
  SSL_CTX_set_verify(t->ctx, o->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
  SSL_CTX_set_client_cert_cb(t->ctx, no_client_cert);
  if (load_files(t->ctx, o, err, errlen) != 0) {
    rl_tls_unref(t);
    return NULL;
  }
  ERR_clear_error();
  return t;
}

rl_tls *rl_tls_ref(rl_tls *t) {
  if (t != NULL) __atomic_fetch_add(&t->refs, 1, __ATOMIC_RELAXED);
  return t;
}

void rl_tls_unref(rl_tls *t) {
  if (t == NULL || __atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  SSL_CTX_free(t->ctx);
  free(t->server_name);
  free(t);
}

int rl_tls_same(const rl_tls *a, const rl_tls *b) {
  return a == b;
}

/* The hint for an OpenSSL reason, or "". */
static const char *hint_for(int reason) {
  switch (reason) {
  case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
    return "; the server requires a client certificate: set tls.cert and tls.key";
  case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
  case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
  case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    return "; the server does not accept the client certificate";
  case SSL_R_WRONG_VERSION_NUMBER:
  case SSL_R_PACKET_LENGTH_TOO_LONG:
  case SSL_R_RECORD_LENGTH_MISMATCH:
  case SSL_R_UNKNOWN_PROTOCOL:
    return "; the server does not speak TLS on this port";
  default:
    return "";
  }
}

void rl_tls_error(char *out, size_t len) {
  unsigned long e = ERR_peek_last_error();
  snprintf(out, len, "%s%s", last_reason("TLS error"), hint_for(ERR_GET_REASON(e)));
  ERR_clear_error();
}

/* Describes a handshake that failed (rc from SSL_connect) into err. */
static void handshake_error(SSL *ssl, int rc, const char *name, const char *where, char *err,
                            size_t errlen) {
  long v = SSL_get_verify_result(ssl);
  char why[256];
  int e = SSL_get_error(ssl, rc);
  if (v == X509_V_ERR_HOSTNAME_MISMATCH || v == X509_V_ERR_IP_ADDRESS_MISMATCH)
    snprintf(err, errlen, "connection: cannot connect to %s (TLS: name mismatch: the server's"
             " certificate does not name \"%s\"; tls.server_name sets the name to check)", where, name);
  else if (v != X509_V_OK)
    snprintf(err, errlen, "connection: cannot connect to %s (TLS: the server's certificate is not"
             " trusted: %s; tls.ca names the trust anchors)", where, X509_verify_cert_error_string(v));
  else if (e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN ||
           (e == SSL_ERROR_SSL && ERR_GET_REASON(ERR_peek_last_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING))
    snprintf(err, errlen, "connection: cannot connect to %s (TLS: the server closed the connection"
             " during the handshake%s%s)", where, errno != 0 && e == SSL_ERROR_SYSCALL ? ": " : "; not a TLS port?",
             errno != 0 && e == SSL_ERROR_SYSCALL ? strerror(errno) : "");
  else {
    rl_tls_error(why, sizeof why);
    snprintf(err, errlen, "connection: cannot connect to %s (TLS handshake failed: %s)", where, why);
  }
  ERR_clear_error();
}

int rl_wait_fd(int fd, short events, long long deadline_ms) {
  for (;;) {
    struct pollfd p;
    long long left = deadline_ms - rl_now_ms();
    int rc;
    if (left <= 0) return 0;
    p.fd = fd;
    p.events = events;
    p.revents = 0;
    rc = poll(&p, 1, (int)(left > 86400000 ? 86400000 : left));
    if (rc > 0) return 1;
    if (rc == 0) return 0;
    if (errno != EINTR) return -1;
  }
}

SSL *rl_tls_handshake(rl_tls *t, int fd, const char *host, const char *where,
                      long long deadline_ms, char *err, size_t errlen) {
  const char *name = t->server_name != NULL ? t->server_name : host;
  unsigned char addr[16];
  int is_ip = inet_pton(AF_INET, name, addr) == 1 || inet_pton(AF_INET6, name, addr) == 1;
  SSL *ssl = SSL_new(t->ctx);
  BIO *bio = ssl != NULL ? BIO_new(sock_method) : NULL;
  if (bio == NULL) {
    SSL_free(ssl);
    snprintf(err, errlen, "connection: cannot connect to %s (TLS: out of memory)", where);
    return NULL;
  }
  BIO_set_data(bio, (void *)(intptr_t)fd);
  BIO_set_init(bio, 1);
  SSL_set_bio(ssl, bio, bio);
  /* SNI carries host names only (RFC 6066); an address is checked against IP SANs. */
  if (!is_ip) SSL_set_tlsext_host_name(ssl, name);
  if (t->verify) {
    int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) : SSL_set1_host(ssl, name);
    SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    if (ok != 1) {
      SSL_free(ssl);
      snprintf(err, errlen, "connection: cannot connect to %s (TLS: cannot check the name \"%s\")", where, name);
      return NULL;
    }
  }
  for (;;) {
    int rc, e;
    ERR_clear_error();
    errno = 0;
    rc = SSL_connect(ssl);
    if (rc == 1) return ssl;
    e = SSL_get_error(ssl, rc);
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
      handshake_error(ssl, rc, name, where, err, errlen);
      SSL_free(ssl);
      return NULL;
    }
    if (rl_wait_fd(fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline_ms) != 1) {
      if (SSL_get_state(ssl) == TLS_ST_CW_CLNT_HELLO)
        snprintf(err, errlen, "connection: cannot connect to %s (TLS: no answer to the TLS hello"
                 " within connect_timeout; not a TLS port?)", where);
      else
        snprintf(err, errlen, "connection: cannot connect to %s (TLS: the handshake did not finish"
                 " within connect_timeout)", where);
      SSL_free(ssl);
      return NULL;
    }
  }
}

ssize_t rl_tls_read(SSL *ssl, char *buf, size_t len) {
  int n, e;
  ERR_clear_error();
  errno = 0;
  n = SSL_read(ssl, buf, len > INT32_MAX ? INT32_MAX : (int)len);
  if (n > 0) return n;
  e = SSL_get_error(ssl, n);
  if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && errno == 0)) return 0;
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) errno = EAGAIN;
  else if (e != SSL_ERROR_SYSCALL) errno = EPROTO;
  return -1;
}

ssize_t rl_tls_write(SSL *ssl, const char *buf, size_t len) {
  int n, e;
  ERR_clear_error();
  errno = 0;
  n = SSL_write(ssl, buf, len > INT32_MAX ? INT32_MAX : (int)len);
  if (n > 0) return n;
  e = SSL_get_error(ssl, n);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) errno = EAGAIN;
  else if (e != SSL_ERROR_SYSCALL || errno == 0) errno = EPROTO;
  return -1;
}

unsigned long long rl_tls_written(const SSL *ssl) {
  return (unsigned long long)BIO_number_written(SSL_get_wbio(ssl)); /* BIO_write counts them */
}

int rl_tls_pending(const SSL *ssl) {
  return SSL_has_pending(ssl); /* decrypted, or read ahead and not yet decrypted */
}

void rl_tls_free(SSL *ssl) {
  SSL_free(ssl);
}
