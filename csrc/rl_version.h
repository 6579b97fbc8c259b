/* SPDX-License-Identifier: MIT */
/* The one version string of redislock; `make lint` checks the rockspecs against it. */
#ifndef REDISLOCK_RL_VERSION_H
#define REDISLOCK_RL_VERSION_H

#define RL_VERSION "0.1.0"

#endif
