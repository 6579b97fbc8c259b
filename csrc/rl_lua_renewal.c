/* SPDX-License-Identifier: MIT */
/* The Renewal type of redislock.core (core.renewal): one node's lease as
   the machine of rl_renewal.h, for the driver that renews over cosockets
   (redislock/ngx_lease.lua). It reads the clock itself (rl_now_ms, which is
   core.now()'s, in ms); times it gives are seconds on core.now()'s clock. */
#include "rl_lua.h"
#include "rl_renewal.h"

#define RENEWAL_MT "redislock.Renewal"

static rl_renewal *check_renewal(lua_State *L) {
  return (rl_renewal *)luaL_checkudata(L, 1, RENEWAL_MT);
}

/*
 * core.renewal(ttl_ms[, opts]) -> renewal
 * A lease acquired with TTL ttl_ms; opts.sent_ms: when the acquire was sent
 * (monotonic ms, default now); opts.max_hold_ms > 0 ends the renewals that
 * long from now; opts.delay_ms > 0: a lock delay (rl_renewal_delay). Its
 * sentences say "the renewal timer" found the loss.
 */
static int core_renewal(lua_State *L) {
  long long ttl = rl_lua_check_ttl_ms(L, 1), max_hold, sent, delay, now = rl_now_ms();
  static const char *const fields[] = { "max_hold_ms", "sent_ms", "delay_ms", NULL };
  rl_renewal *r;
  rl_lua_push_fields(L, 2, fields); /* at 3 to 5, where the checks below name them */
  max_hold = rl_lua_opt_ms(L, 3, "max_hold", 0);
  sent = rl_lua_opt_ms(L, 4, "sent", now);
  delay = rl_lua_opt_ms(L, 5, "delay", 0);
  luaL_argcheck(L, delay <= RL_MAX_MS - ttl, 2, "ttl and delay_ms must add up to at most 2^53 ms");
  r = (rl_renewal *)lua_newuserdatauv(L, sizeof *r, 0);
  rl_renewal_init(r, "the renewal timer", ttl, max_hold, sent, now);
  rl_renewal_delay(r, delay);
  luaL_setmetatable(L, RENEWAL_MT);
  return 1;
}

/* renewal:next() -> "now" (send one: renewal:sent() first), "later" with
   the seconds when it is due, or nil (not held, or one is on its way). A
   renewal due after max_hold ends the lease instead. */
static int renewal_next(lua_State *L) {
  rl_renewal *r = check_renewal(L);
  rl_renew_next what = rl_renewal_next(r, rl_now_ms());
  if (what == RL_RENEW_NONE) return 0;
  lua_pushstring(L, what == RL_RENEW_NOW ? "now" : "later");
  lua_pushnumber(L, (lua_Number)r->due / 1000.0);
  return 2;
}

/* renewal:due() -> seconds when the next renewal is due. */
static int renewal_due(lua_State *L) {
  lua_pushnumber(L, (lua_Number)check_renewal(L)->due / 1000.0);
  return 1;
}

/* renewal:sent() -> the TTL (ms) the renewal going out now sets. */
static int renewal_sent(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)rl_renewal_sent(check_renewal(L), rl_now_ms()));
  return 1;
}

/* renewal:answer(status[, err]) -> "renewed" | "retry" | "lost" | "over", why
   The answer of the renewal on its way: the extend script's status (1, 0,
   -1), or nil and the error when it was not sent or not answered. why: the
   loss's sentence fragment, or the error of one tried again. */
static int renewal_answer(lua_State *L) {
  rl_renewal *r = check_renewal(L);
  int answered = !lua_isnoneornil(L, 2);
  lua_Integer s = answered ? luaL_checkinteger(L, 2) : 0;
  int status = (int)s;
  const char *err = answered ? NULL : luaL_optstring(L, 3, "connection: no answer");
  luaL_argcheck(L, s >= -1 && s <= 1, 2, "status must be 1, 0 or -1");
  rl_renew_outcome out = rl_renewal_answer(r, rl_now_ms(), answered, status, err);
  static const char *const names[] = { "renewed", "retry", "lost", "over" };
  lua_pushstring(L, names[out]);
  if (out == RL_RENEW_LOST) lua_pushstring(L, r->why);
  else if (out == RL_RENEW_RETRY) lua_pushstring(L, err);
  else return 1;
  return 2;
}

/* renewal:extended(ttl_ms[, sent_ms]): the owner extended the lock with a
   command sent at sent_ms (default now). */
static int renewal_extended(lua_State *L) {
  rl_renewal *r = check_renewal(L);
  long long ttl = rl_lua_check_ttl_ms(L, 2), now = rl_now_ms();
  rl_renewal_extended(r, ttl, rl_lua_opt_ms(L, 3, "sent", now), now);
  return 0;
}

/* renewal:moved(): the lock's node changed; renew there at once. */
static int renewal_moved(lua_State *L) {
  rl_renewal_moved(check_renewal(L), rl_now_ms());
  return 0;
}

/* renewal:stop(): no more renewals (ended, when it was held). */
static int renewal_stop(lua_State *L) {
  rl_renewal_stop(check_renewal(L), NULL);
  return 0;
}

/* renewal:state() -> "held" | "ended" | "lost", why */
static int renewal_state(lua_State *L) {
  rl_renewal *r = check_renewal(L);
  lua_pushstring(L, r->state == RL_LEASE_HELD ? "held" : r->state == RL_LEASE_LOST ? "lost" : "ended");
  if (r->state != RL_LEASE_LOST) return 1;
  lua_pushstring(L, r->why);
  return 2;
}

/* renewal:expires() -> seconds by which the lock expires unless renewed. */
static int renewal_expires(lua_State *L) {
  lua_pushnumber(L, (lua_Number)rl_renewal_expires(check_renewal(L)) / 1000.0);
  return 1;
}

/* renewal:due_now() -> whether a renewal is on its way or due. */
static int renewal_due_now(lua_State *L) {
  lua_pushboolean(L, rl_renewal_due_now(check_renewal(L), rl_now_ms()));
  return 1;
}

static const luaL_Reg renewal_methods[] = {
  { "next", renewal_next },
  { "due", renewal_due },
  { "sent", renewal_sent },
  { "answer", renewal_answer },
  { "extended", renewal_extended },
  { "moved", renewal_moved },
  { "stop", renewal_stop },
  { "state", renewal_state },
  { "expires", renewal_expires },
  { "due_now", renewal_due_now },
  { NULL, NULL }
};

static const luaL_Reg renewal_meta[] = {
  { NULL, NULL }
};

/* core.renewal_step(ttl_ms) -> ms between renewals of a lease of that TTL
   (rl_renewal_step: the one place that says how often). */
static int core_renewal_step(lua_State *L) {
  lua_Integer ttl_ms = luaL_checkinteger(L, 1);
  luaL_argcheck(L, ttl_ms > 0, 1, "a TTL of at least 1 ms");
  lua_pushinteger(L, (lua_Integer)rl_renewal_step((long long)ttl_ms));
  return 1;
}

static const luaL_Reg renewal_functions[] = {
  { "renewal", core_renewal },
  { "renewal_step", core_renewal_step },
  { NULL, NULL }
};

void rl_lua_open_renewal(lua_State *L) {
  rl_lua_newtype(L, RENEWAL_MT, renewal_meta, renewal_methods);
  luaL_setfuncs(L, renewal_functions, 0);
}
