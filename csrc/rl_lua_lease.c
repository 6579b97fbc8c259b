/* SPDX-License-Identifier: MIT */
/* The Lease type of redislock.core (client:lease): a lock renewed by the
   watchdog thread, a node lease as redislock/lease.lua composes them; the
   per-state sentinel that stops the thread with the last state. */
#include "rl_lua.h"
#include "rl_watchdog.h"

#define LEASE_MT RL_LEASE_MT
#define WATCHDOG_MT "redislock.Watchdog"

typedef struct {
  rl_lease *lease; /* NULL once stopped */
} rl_lease_ud;

/*
 * client:lease(key, token, ttl_ms[, opts]) -> lease | nil, err
 * Has the watchdog thread renew the lock key/token to ttl_ms every ttl_ms/3
 * (with opts.op: "extend", the default, or "sem_extend", "read_extend",
 * "write_extend", "elect_extend"), on a connection of its own made like the client's, until
 * lease:stop() or the lease is collected; opts.max_hold_ms > 0 ends the
 * renewals that long from now. opts.sent_ms: when the acquire was sent
 * (monotonic ms; default now). opts.delay_ms > 0: the lock delay, which each
 * renewal adds to ttl_ms on the server (rl_lease_start). The other node
 * leases' via, scoped and owner are not read: the watchdog follows
 * redirects itself, and leaves losses to lock:check and with_lock's hook
 * (the lease has no field notifies).
 */
int rl_lua_client_lease(lua_State *L) {
  rl_client *c = rl_lua_check_client(L, 1);
  size_t klen, tlen;
  const char *key = luaL_checklstring(L, 2, &klen);
  const char *token = luaL_checklstring(L, 3, &tlen);
  const char *why = rl_check_key(key, klen);
  long long ttl;
  static const char *const extends[] = { "extend", "sem_extend", "read_extend", "write_extend", "elect_extend",
                                          NULL };
  long long max_hold, sent, delay;
  rl_op op;
  static const char *const fields[] = { "max_hold_ms", "sent_ms", "op", "delay_ms", NULL };
  rl_lua_push_fields(L, 5, fields); /* at 6 to 9, where the checks below name them */
  max_hold = rl_lua_opt_ms(L, 6, "max_hold", 0);
  sent = rl_lua_opt_ms(L, 7, "sent", rl_now_ms());
  op = rl_lua_opt_op(L, 8, extends);
  delay = rl_lua_opt_ms(L, 9, "delay", 0);
  if (why != NULL) luaL_argerror(L, 2, why);
  luaL_argcheck(L, tlen > 0, 3, "token must not be empty");
  ttl = rl_lua_check_ttl_ms(L, 4);
  luaL_argcheck(L, delay <= RL_MAX_MS - ttl, 5, "ttl and delay_ms must add up to at most 2^53 ms");
  luaL_getmetatable(L, LEASE_MT);
  return rl_lua_push_lease(L, c, lua_gettop(L), op, key, klen, token, tlen, ttl, delay, max_hold, sent);
}

int rl_lua_push_lease(lua_State *L, rl_client *c, int mt, rl_op op, const char *key, size_t klen,
                      const char *token, size_t tlen, long long ttl, long long delay, long long max_hold,
                      long long sent) {
  char err[RL_ERRLEN];
  /* Made empty first: an error below cannot leak the lease. */
  rl_lease_ud *ud = (rl_lease_ud *)lua_newuserdatauv(L, sizeof *ud, 0);
  ud->lease = NULL;
  lua_pushvalue(L, mt);
  lua_setmetatable(L, -2);
  ud->lease = rl_lease_start(&c->conn.o, op, c->prefix, c->plen, key, klen, token, tlen, ttl,
                             delay, max_hold, sent, err);
  if (ud->lease == NULL) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  return 1;
}

int rl_lua_stop_held_lease(lua_State *L, int idx, int mt, lua_Number *at) {
  rl_lease_ud *ud = (rl_lease_ud *)lua_touserdata(L, idx);
  int same;
  if (ud == NULL || !lua_getmetatable(L, idx)) return 0;
  same = lua_rawequal(L, -1, mt);
  lua_pop(L, 1);
  if (!same || ud->lease == NULL || rl_lease_state_of(ud->lease, NULL, 0) != RL_LEASE_HELD) return 0;
  *at = (lua_Number)rl_lease_expires(ud->lease) / 1000.0;
  rl_lease_stop(ud->lease, 0);
  ud->lease = NULL;
  return 1;
}

/*
 * lease:state() -> "held" | "ended" | "lost", why
 * What the watchdog knows: "ended" once max_hold stopped the renewals; "lost"
 * with a sentence fragment when a renewal found the lock gone or taken, or
 * could not reach the server within the TTL. A stopped lease says "ended".
 */
static int lease_state(lua_State *L) {
  rl_lease_ud *ud = (rl_lease_ud *)luaL_checkudata(L, 1, LEASE_MT);
  char why[RL_ERRLEN];
  rl_lease_state s = ud->lease == NULL ? RL_LEASE_ENDED : rl_lease_state_of(ud->lease, why, sizeof why);
  lua_pushstring(L, s == RL_LEASE_HELD ? "held" : s == RL_LEASE_LOST ? "lost" : "ended");
  if (s != RL_LEASE_LOST) return 1;
  lua_pushstring(L, why);
  return 2;
}

/* lease:extended(ttl_ms[, sent_ms]): the owner extended the lock with a
   command sent at sent_ms (default now); renew to ttl_ms from then on. */
static int lease_extended(lua_State *L) {
  rl_lease_ud *ud = (rl_lease_ud *)luaL_checkudata(L, 1, LEASE_MT);
  long long sent = rl_lua_opt_ms(L, 3, "sent", rl_now_ms());
  long long ttl = rl_lua_check_ttl_ms(L, 2);
  if (ud->lease != NULL) rl_lease_extended(ud->lease, ttl, sent);
  return 0;
}

/* lease:expires() -> seconds on core.now()'s clock by which the lock expires
   unless renewed again (from the last confirmed renewal); nil once stopped. */
static int lease_expires(lua_State *L) {
  rl_lease_ud *ud = (rl_lease_ud *)luaL_checkudata(L, 1, LEASE_MT);
  if (ud->lease == NULL) return 0;
  lua_pushnumber(L, (lua_Number)rl_lease_expires(ud->lease) / 1000.0);
  return 1;
}

/* lease:due_now() -> whether a renewal is on its way now, or due. */
static int lease_due_now(lua_State *L) {
  rl_lease_ud *ud = (rl_lease_ud *)luaL_checkudata(L, 1, LEASE_MT);
  lua_pushboolean(L, ud->lease != NULL && rl_lease_due_now(ud->lease));
  return 1;
}

/* lease:stop([settle]) -> what expires() said, answered (nothing once
   stopped); also __gc: no more renewals. Idempotent; no I/O. settle true:
   waits for a renewal under way to end (redislock run --min-hold);
   answered: false when one was on its way and was not answered, so that
   it may still land after what the caller sends next (rl_lease_stop). */
static int lease_stop(lua_State *L) {
  rl_lease_ud *ud = (rl_lease_ud *)luaL_checkudata(L, 1, LEASE_MT);
  int answered;
  if (ud->lease == NULL) return 0;
  /* What expires() would have said, in the same call: release needs both. */
  lua_pushnumber(L, (lua_Number)rl_lease_expires(ud->lease) / 1000.0);
  answered = rl_lease_stop(ud->lease, lua_toboolean(L, 2));
  ud->lease = NULL;
  lua_pushboolean(L, answered);
  return 2;
}

/* __gc of the per-state sentinel: the last Lua state out stops the thread. */
static int watchdog_leave(lua_State *L) {
  (void)L;
  rl_watchdog_leave();
  return 0;
}

static const luaL_Reg lease_methods[] = {
  { "state", lease_state },
  { "extended", lease_extended },
  { "expires", lease_expires },
  { "due_now", lease_due_now },
  { "stop", lease_stop },
  { NULL, NULL }
};

static const luaL_Reg lease_meta[] = {
  { "__gc", lease_stop },
  { NULL, NULL }
};

static const luaL_Reg watchdog_meta[] = {
  { "__gc", watchdog_leave },
  { NULL, NULL }
};

void rl_lua_open_lease(lua_State *L) {
  rl_lua_newtype(L, LEASE_MT, lease_meta, lease_methods);
  rl_lua_newtype(L, WATCHDOG_MT, watchdog_meta, NULL);
  /* A sentinel that lives as long as this Lua state: its __gc runs when the
     state closes (before the module is unloaded: it was made after the
     package library's table of loaded C libraries). */
  lua_newuserdatauv(L, 1, 0);
  luaL_setmetatable(L, WATCHDOG_MT);
  rl_watchdog_enter(); /* after the allocations: the __gc above is now certain to run */
  luaL_ref(L, LUA_REGISTRYINDEX);
}
