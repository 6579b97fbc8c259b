/* SPDX-License-Identifier: MIT */
/* SHA-1 (FIPS 180-4), just enough to compute the name Redis gives a script. */
#include "rl_sha1.h"

#include <stdint.h>
#include <string.h>

typedef struct {
  uint32_t h[5];
  uint64_t bytes;
  unsigned char block[64];
  size_t used;
} sha1_ctx;

static uint32_t rol(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

/* Folds one 64-byte block into the running state. */
static void sha1_block(sha1_ctx *c, const unsigned char *p) {
  uint32_t w[80], a, b, d, e, f, k, t, cc;
  int i;
  for (i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
           (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
  for (i = 16; i < 80; i++)
    w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
  a = c->h[0]; b = c->h[1]; cc = c->h[2]; d = c->h[3]; e = c->h[4];
  for (i = 0; i < 80; i++) {
    if (i < 20)      { f = (b & cc) | (~b & d);           k = 0x5A827999u; }
    else if (i < 40) { f = b ^ cc ^ d;                    k = 0x6ED9EBA1u; }
    else if (i < 60) { f = (b & cc) | (b & d) | (cc & d); k = 0x8F1BBCDCu; }
    else             { f = b ^ cc ^ d;                    k = 0xCA62C1D6u; }
    t = rol(a, 5) + f + e + k + w[i];
    e = d; d = cc; cc = rol(b, 30); b = a; a = t;
  }
  c->h[0] += a; c->h[1] += b; c->h[2] += cc; c->h[3] += d; c->h[4] += e;
}

static void sha1_update(sha1_ctx *c, const unsigned char *p, size_t n) {
  c->bytes += n;
  while (n > 0) {
    size_t take = 64 - c->used;
    if (take > n) take = n;
    memcpy(c->block + c->used, p, take);
    c->used += take; p += take; n -= take;
    if (c->used == 64) { sha1_block(c, c->block); c->used = 0; }
  }
}

void rl_sha1_hex(const void *data, size_t len, char hex[41]) {
  static const char digits[] = "0123456789abcdef";
  static const unsigned char pad = 0x80, zero = 0;
  sha1_ctx c = { { 0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u },
                 0, { 0 }, 0 };
  unsigned char lenbe[8];
  uint64_t bits;
  int i;
  sha1_update(&c, (const unsigned char *)data, len);
  bits = c.bytes * 8;
  for (i = 0; i < 8; i++) lenbe[i] = (unsigned char)(bits >> (56 - 8 * i));
  sha1_update(&c, &pad, 1);
  while (c.used != 56) sha1_update(&c, &zero, 1);
  sha1_update(&c, lenbe, 8);
  for (i = 0; i < 20; i++) {
    unsigned char byte = (unsigned char)(c.h[i / 4] >> (24 - 8 * (i % 4)));
    hex[2 * i] = digits[byte >> 4];
    hex[2 * i + 1] = digits[byte & 15];
  }
  hex[40] = '\0';
}
