/* SPDX-License-Identifier: MIT */
/* SHA-1, only to name our server-side scripts for EVALSHA (not for security). */
#ifndef REDISLOCK_RL_SHA1_H
#define REDISLOCK_RL_SHA1_H

#include <stddef.h>

#pragma GCC visibility push(hidden)

/* Writes the 40 lowercase hex digits of SHA-1(data) and a NUL into hex. */
void rl_sha1_hex(const void *data, size_t len, char hex[41]);

#pragma GCC visibility pop

#endif
