/* SPDX-License-Identifier: MIT */
/*
 * Processes for the `redislock` command: spawn a command, reap it, signal
 * it, and catch signals to pass on (see rl_proc.c).
 */
#ifndef REDISLOCK_RL_PROC_H
#define REDISLOCK_RL_PROC_H

#include "rl_compat.h"

#pragma GCC visibility push(hidden)

/* Adds spawn, reap, kill, trap, trapped, signal_number, getpid and hostname to the
   table at the top of L's stack (the core module). */
void rl_proc_register(lua_State *L);

#pragma GCC visibility pop

#endif
