/* SPDX-License-Identifier: MIT */
/* The lock protocol: scripts, command arguments, reply decoding, tokens, checks. */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* getrandom, O_CLOEXEC under -std=c99 */
#endif
#include "rl_proto.h"
#include "rl_sha1.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/random.h>
#endif

/*
 * The scripts. Keys and tokens arrive only as KEYS/ARGV, never in the text.
 * Each replies {status, value} with status 1 (ours), 0 (no key), -1 (another
 * owner's, or other waiters are ahead in a fair queue); acquire and release,
 * run on every cycle, reply one integer for the two (see rl_result: an
 * array reply costs Redis about half a microsecond more). The keys share the
 * lock's hash tag, so Redis Cluster runs each script on one node:
 *   <prefix>{<key>}          the lock: its value is the owner's token
 *   <prefix>{<key>}:fence    the fencing counter (never expires)
 *   <prefix>{<key>}:signal   wake-one list waiters block on (BLPOP); a fair
 *                            waiter blocks on <...>:signal:<its token>
 *   <prefix>{<key>}:queue    fair waiters by arrival (score: server time, us)
 *   <prefix>{<key>}:alive    fair waiters by deadline (score: ms); one that
 *                            stops coming back by then leaves the queue
 *   <prefix>{<key>}:waiters  the waiters mark: set by every acquire that
 *                            fails, for the holder's TTL and a second (for a
 *                            fair waiter: as long as it stays queued)
 *
 * The first try of an acquire is a take, no script: MULTI, SET key token NX
 * PX ms, INCR fence, GET of the slot's era record, EXEC, one atomic step
 * that costs Redis less than the acquire script (no script call, no reply
 * conversion, no INFO: see "Fences across failovers"). Its INCR runs also
 * when the lock is held, so fences grow by more than one now and then; they
 * still only grow. A take that finds the lock held is followed by the
 * acquire script, which tells the holder's TTL and sets the waiters mark;
 * so is a take whose answer was lost (never a take
 * twice: a second SET NX would find our own lock).
 *
 * acquire is resend-safe: if the key already holds our token (an earlier send
 * that timed out did land), it refreshes the TTL and answers the counter's
 * value (plus the era's offset), which is the fence that acquisition took or
 * larger (a take that
 * failed since bumped it): larger than every earlier holder's, and smaller
 * than any later holder's, which INCR after our release. Should the counter
 * have vanished meanwhile (FLUSHDB, eviction), it takes a new value rather
 * than answer 0.
 *
 * Waking: release (and a fair waiter that gives up while the lock is free)
 * pushes one element onto one signal list when the waiters mark says that
 * somebody may wait (with nobody waiting, a release is GET, DEL and EXISTS),
 * so exactly one blocked waiter wakes: the first live one of the fair queue
 * if there is one, else whoever blocks on the shared list. The list expires
 * after RL_SIGNAL_MS, so a waiter that was between its attempt and its BLPOP
 * still finds it, and nothing is left behind. The mark is safe to miss only
 * after a waiter's BLPOP ended: a waiter never blocks past the holder's TTL
 * it was told (wait.lua), and one that tries again and fails sets the mark
 * again. The signal key of a fair waiter is built in the script (from
 * KEYS[2] and the queue's token); it has the same hash tag.
 *
 * Fences across failovers. Replication is asynchronous: a promoted replica
 * may lack the last INCRs of the master it replaces, and that master may
 * go on granting locks until it is demoted. So a fence is the counter plus
 * the offset of the master's era, kept per hash slot (Cluster runs a
 * script on one slot) in a record that never expires:
 *   <prefix>{<tag>}:era      "<master_replid> <offset>"; tag: rl_era_tag
 * A master's replication ID is new whenever it becomes a master (promoted,
 * or restarted), so a record that names another ID than INFO replication's
 * was written under an earlier master: a new era starts, whose offset is
 * the master's clock (TIME) in milliseconds, or the record's offset plus
 * RL_ERA_STEP when that is larger (a clock behind). The clock, not the old
 * offset plus a constant: two masters that start their eras from the same
 * record (a master restarted, its replicas not yet copying its new era,
 * then one of them promoted; make torture found it) must not share an
 * offset, and they start at different times. Every fence of the new
 * master is above every fence of the old one as long as the old one
 * granted fewer locks on one key that the new one never saw than there
 * were milliseconds between the two eras' starts. A record missing on a
 * server that was never a replica (master_replid2 all zeros) starts at 0,
 * so a plain server's fences are the counter, as before; missing anywhere
 * else it starts a new era. Milliseconds, not finer: fences stay below
 * 10^14, which LuaJIT's tostring still writes whole (14 digits), until the
 * year 5138. INFO costs about 2.5 us, so the scripts
 * read it only when they grant, and the take does not run it at all: it
 * reads the record in its transaction, and trusts it when the connection
 * vouches for the record's master ID, which a connection does only after
 * the acquire script checked that ID against INFO on that very
 * connection. The C transport keeps that ID with the connection
 * (rl_conn.era, forgotten when the connection closes); a pooled cosocket
 * carries no state of ours, so the OpenResty transport names the
 * connection RL_ERA_NAME and the ID (CLIENT SETNAME, in the acquire's
 * write) and its take asks the name back (CLIENT GETNAME). Connections are
 * closed when a server restarts, and Sentinel closes them when it promotes
 * or demotes; a connection that stays open while its server is demoted and
 * promoted again still vouches for an ID that may match a record no new
 * master wrote (README: limits).
 */

#define RL_STR_(x) #x
#define RL_STR(x) RL_STR_(x)

/* Drops fair waiters whose deadline passed, and a head of the queue with no
   deadline at all (left by an eviction or a partial delete); leaves `now`
   (ms, server time). */
#define PRUNE_QUEUE(queue, alive)                                          \
  "local t = redis.call('TIME')\n"                                         \
  "local now = t[1] * 1000 + math.floor(t[2] / 1000)\n"                    \
  "local dead = redis.call('ZRANGEBYSCORE', " alive ", '-inf', now)\n"     \
  "for _, w in ipairs(dead) do redis.call('ZREM', " queue ", w) end\n"   \
  "if #dead > 0 then redis.call('ZREMRANGEBYSCORE', " alive ", '-inf', now) end\n" \
  "while true do\n"                                                        \
  "  local h = redis.call('ZRANGE', " queue ", 0, 0)[1]\n"                 \
  "  if not h or redis.call('ZSCORE', " alive ", h) then break end\n"      \
  "  redis.call('ZREM', " queue ", h)\n"                                   \
  "end\n"

/* Wakes one waiter: the fair queue's head, else the shared list. */
#define SIGNAL_ONE(signal, queue)                                          \
  "local head = redis.call('ZRANGE', " queue ", 0, 0)[1]\n"                \
  "local sig = head and (" signal " .. ':' .. head) or " signal "\n"       \
  "redis.call('DEL', sig)\n"                                               \
  "redis.call('RPUSH', sig, 1)\n"                                          \
  "redis.call('PEXPIRE', sig, " RL_STR(RL_SIGNAL_MS) ")\n"

/* Leaves `now` (ms, server time) and `t` (TIME's reply). */
#define NOW                                                                \
  "local t = redis.call('TIME')\n"                                         \
  "local now = t[1] * 1000 + math.floor(t[2] / 1000)\n"

/* A whole number as Redis wants it (Lua 5.1 would write 1e+15). */
#define FMT "string.format('%.0f', "

/* Defines era(rec): the fence offset of this master's era in the slot whose
   era record is rec (see "Fences across failovers"), starting a new era
   there when the record names another master; it leaves era_id, this
   master's ID. INFO is read once a script. */
#define ERA_FN                                                             \
  "local era_info, era_id\n"                                               \
  "local function era(rec)\n"                                              \
  "  era_info = era_info or redis.call('INFO', 'replication')\n"           \
  "  local id = string.match(era_info, 'master_replid:(%x+)')\n"           \
  "  if not id then error('redislock: INFO replication names no master_replid') end\n" \
  "  era_id = id\n"                                                        \
  "  local r = redis.call('GET', rec)\n"                                   \
  "  local off = r and tonumber(string.match(r, ' (%d+)$')) or 0\n"        \
  "  if r and string.sub(r, 1, #id + 1) == id .. ' ' then return off end\n" \
  "  if r or not string.find(era_info, 'master_replid2:' .. string.rep('0', 40), 1, true) then\n" \
  "    local t = redis.call('TIME')\n"                                       \
  "    off = math.max(off + " RL_STR(RL_ERA_STEP) ", t[1] * 1000 + math.floor(t[2] / 1000))\n" \
  "  end\n"                                                                \
  "  redis.call('SET', rec, id .. ' ' .. " FMT "off))\n"                   \
  "  return off\n"                                                         \
  "end\n"

/* A sorted set of holders by expiry lasts as long as its last holder. */
#define ZSET_EXPIRE(z)                                                     \
  "local last = redis.call('ZRANGE', " z ", -1, -1, 'WITHSCORES')[2]\n"    \
  "if last then redis.call('PEXPIRE', " z ", " FMT "math.max(tonumber(last) - now, 1))) end\n"

/* Wakes every waiter of a read-write lock (they wait by deadline in a sorted
   set): one element each on the signal list, at most 1000. */
#define WAKE_ALL(signal, waiters)                                          \
  "redis.call('ZREMRANGEBYSCORE', " waiters ", '-inf', now)\n"             \
  "local n = math.min(redis.call('ZCARD', " waiters "), 1000)\n"           \
  "if n > 0 then\n"                                                        \
  "  local ones = {}\n"                                                    \
  "  for i = 1, n do ones[i] = 1 end\n"                                    \
  "  redis.call('DEL', " signal ")\n"                                      \
  "  redis.call('RPUSH', " signal ", unpack(ones))\n"                      \
  "  redis.call('PEXPIRE', " signal ", " RL_STR(RL_SIGNAL_MS) ")\n"        \
  "end\n"

/* A read-write lock's waiter stays in the waiters set until it could have
   taken the lock (left ms from now) and a second more. */
#define RW_MARK(waiters)                                                   \
  "redis.call('ZADD', " waiters ", " FMT "now + math.max(left, 0) + " RL_STR(RL_WAITERS_SLACK_MS) "), ARGV[1])\n" \
  "local wlast = tonumber(redis.call('ZRANGE', " waiters ", -1, -1, 'WITHSCORES')[2])\n" \
  "redis.call('PEXPIRE', " waiters ", " FMT "math.max(wlast - now, 1)))\n"

/* A holder of a sorted set by expiry (semaphore permits, readers), or a
   writer: the fence of a resend that found its token, else the next one,
   in this master's era (ERA_FN). */
#define FENCE_OF(fence, rec, resent)                                       \
  "if " resent " then\n"                                                   \
  "  local fence = tonumber(redis.call('GET', " fence "))\n"               \
  "  if fence and fence >= 1 then return fence + era(" rec ") end\n"       \
  "end\n"                                                                  \
  "return redis.call('INCR', " fence ") + era(" rec ")\n"

/* Extend and PTTL of a holder of a sorted set by expiry: KEYS[1] the set;
   ARGV[1] token (, ARGV[2] ttl). An entry past its expiry is gone. */
#define ZSET_EXTEND                                                        \
  NOW                                                                      \
  "local s = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"                     \
  "if not s or tonumber(s) <= now then\n"                                  \
  "  if s then redis.call('ZREM', KEYS[1], ARGV[1]) end\n"                 \
  "  return {0, 0}\n"                                                      \
  "end\n"                                                                  \
  "redis.call('ZADD', KEYS[1], " FMT "now + tonumber(ARGV[2])), ARGV[1])\n" \
  ZSET_EXPIRE("KEYS[1]")                                                   \
  "return {1, tonumber(ARGV[2])}\n"
#define ZSET_PTTL                                                          \
  NOW                                                                      \
  "local s = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"                     \
  "if not s or tonumber(s) <= now then return {0, 0} end\n"                \
  "return {1, tonumber(s) - now}\n"

/* The lock's extend and PTTL (also a read-write lock's writer's). */
#define KEY_EXTEND                                                         \
  "local v = redis.call('GET', KEYS[1])\n"                                 \
  "if v == ARGV[1] then\n"                                                 \
  "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"                            \
  "  return {1, tonumber(ARGV[2])}\n"                                      \
  "end\n"                                                                  \
  "if v then return {-1, redis.call('PTTL', KEYS[1])} end\n"               \
  "return {0, 0}\n"
#define KEY_PTTL                                                           \
  "local v = redis.call('GET', KEYS[1])\n"                                 \
  "if v == ARGV[1] then\n"                                                 \
  "  return {1, redis.call('PTTL', KEYS[1])}\n"                            \
  "end\n"                                                                  \
  "if v then return {-1, redis.call('PTTL', KEYS[1])} end\n"               \
  "return {0, 0}\n"

static const char *const script_text[RL_OP_COUNT] = {
  /* RL_OP_ACQUIRE: KEYS lock, fence, waiters, era; ARGV[1] token, ARGV[2]
     ttl (ms), and after a take that could not tell the fence, ARGV[3] the
     master ID its era record names, which the connection trusts from then
     on when it is this master's (rl_cmd_claim). Replies one integer: the
     fence, or -2 - the holder's PTTL; or {2, the fence} when the lock is
     ours but this master's ID is not ARGV[3] (an earlier master wrote the
     record: not to be trusted). */
  ERA_FN
  "local function ours(fence)\n"
  "  if ARGV[3] and ARGV[3] ~= era_id then return {2, fence} end\n"
  "  return fence\n"
  "end\n"
  "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then\n"
  "  return ours(redis.call('INCR', KEYS[2]) + era(KEYS[4]))\n"
  "end\n"
  "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
  "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
  "  local fence = tonumber(redis.call('GET', KEYS[2]))\n"
  "  if fence and fence >= 1 then return ours(fence + era(KEYS[4])) end\n"
  "  return ours(redis.call('INCR', KEYS[2]) + era(KEYS[4]))\n"
  "end\n"
  "local left = redis.call('PTTL', KEYS[1])\n"
  "redis.call('SET', KEYS[3], 1, 'PX', math.max(left, 0) + " RL_STR(RL_WAITERS_SLACK_MS) ")\n"
  "return -2 - left\n",
  /* RL_OP_RELEASE: KEYS lock, signal, queue, alive, waiters; ARGV[1] token.
     The wake-up runs only when the waiters mark is set, and under pcall:
     once the lock is deleted, a failure there (a key of the wrong type, no
     memory) must not turn the release into an error, as Redis does not
     undo the DEL. Replies one integer: 1, 0 (no lock), or -2 - the PTTL
     of another owner's. */
  "local v = redis.call('GET', KEYS[1])\n"
  "if v == ARGV[1] then\n"
  "  redis.call('DEL', KEYS[1])\n"
  "  if redis.call('EXISTS', KEYS[5]) == 1 then pcall(function()\n"
  PRUNE_QUEUE("KEYS[3]", "KEYS[4]")
  SIGNAL_ONE("KEYS[2]", "KEYS[3]")
  "  end) end\n"
  "  return 1\n"
  "end\n"
  "if v then return -2 - redis.call('PTTL', KEYS[1]) end\n"
  "return 0\n",
  /* RL_OP_EXTEND: KEYS lock; ARGV[1] token, ARGV[2] ttl (ms) */
  KEY_EXTEND,
  /* RL_OP_PTTL: KEYS lock; ARGV[1] token */
  KEY_PTTL,
  /* RL_OP_ACQUIRE_FAIR: KEYS lock, fence, queue, alive, waiters, era; ARGV[1] token,
     ARGV[2] ttl (ms), ARGV[3] how long a waiter stays queued without coming
     back (ms). Takes the lock only when it is free and no live waiter came
     first; else queues the token (keeping its first arrival) and answers
     {-1, PTTL of the holder, or -2 when the lock is free}. */
  ERA_FN
  PRUNE_QUEUE("KEYS[3]", "KEYS[4]")
  "local v = redis.call('GET', KEYS[1])\n"
  "if v == ARGV[1] then\n"
  "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
  "  local fence = redis.call('GET', KEYS[2])\n"
  "  if fence then return {1, tonumber(fence) + era(KEYS[6])} end\n"
  "  return {1, redis.call('INCR', KEYS[2]) + era(KEYS[6])}\n"
  "end\n"
  "if not v then\n"
  "  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]\n"
  "  if head == nil or head == ARGV[1] then\n"
  "    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\n"
  "    redis.call('ZREM', KEYS[3], ARGV[1])\n"
  "    redis.call('ZREM', KEYS[4], ARGV[1])\n"
  "    return {1, redis.call('INCR', KEYS[2]) + era(KEYS[6])}\n"
  "  end\n"
  "end\n"
  "if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then\n"
  "  redis.call('ZADD', KEYS[3], t[1] .. string.format('%06d', t[2]), ARGV[1])\n"
  "end\n"
  "redis.call('ZADD', KEYS[4], now + ARGV[3], ARGV[1])\n"
  "redis.call('PEXPIRE', KEYS[3], ARGV[3])\n"
  "redis.call('PEXPIRE', KEYS[4], ARGV[3])\n"
  "local left = v and redis.call('PTTL', KEYS[1]) or -2\n"
  "redis.call('SET', KEYS[5], 1, 'PX', math.max(left, tonumber(ARGV[3])) + " RL_STR(RL_WAITERS_SLACK_MS) ")\n"
  "return {-1, left}\n",
  /* RL_OP_LEAVE: KEYS lock, signal, queue, alive; ARGV[1] token. A fair
     waiter gives up: it leaves the queue, and if the lock is free the next
     waiter is woken (it would otherwise wait for its own timeout). */
  "redis.call('ZREM', KEYS[3], ARGV[1])\n"
  "redis.call('ZREM', KEYS[4], ARGV[1])\n"
  "if redis.call('EXISTS', KEYS[1]) == 0 then\n"
  PRUNE_QUEUE("KEYS[3]", "KEYS[4]")
  SIGNAL_ONE("KEYS[2]", "KEYS[3]")
  "end\n"
  "return {0, 0}\n",
  /* RL_OP_TAKE: no script (MULTI/EXEC, see rl_cmd_bytes) */
  NULL,
  /* RL_OP_RELEASE_ONE: KEYS lock; ARGV[1] token. Release without the
     wake-up, whose keys may be missing on a node while the slot moves
     (Redis answers TRYAGAIN to a script with some of its keys missing
     then); waiters find the lock free by the bound of their wait. Replies
     as release. */
  "local v = redis.call('GET', KEYS[1])\n"
  "if v == ARGV[1] then\n"
  "  redis.call('DEL', KEYS[1])\n"
  "  return 1\n"
  "end\n"
  "if v then return -2 - redis.call('PTTL', KEYS[1]) end\n"
  "return 0\n",
  /* RL_OP_FENCE_UP: KEYS lock, fence, era; ARGV[1] token, ARGV[2] a fence.
     Only while the lock holds our token (a holder whose lock expired must
     not push a stale fence past a newer holder's), the counter is raised
     so that this server's fence (counter + its era's offset) is at least
     ARGV[2]. Replies as release: 1 (ours, done), 0, or -2 - PTTL. */
  ERA_FN
  "local v = redis.call('GET', KEYS[1])\n"
  "if v == ARGV[1] then\n"
  "  local want = tonumber(ARGV[2]) - era(KEYS[3])\n"
  "  if (tonumber(redis.call('GET', KEYS[2])) or 0) < want then\n"
  "    redis.call('SET', KEYS[2], " FMT "want))\n"
  "  end\n"
  "  return 1\n"
  "end\n"
  "if v then return -2 - redis.call('PTTL', KEYS[1]) end\n"
  "return 0\n",
  /* RL_OP_SEM_ACQUIRE: KEYS permits, fence, waiters, era; ARGV[1] token, ARGV[2]
     ttl (ms), ARGV[3] the limit. Expired permits are dropped first (by the
     server's clock); a token already holding a permit (a resend) keeps it.
     Replies as acquire: the fence, or -2 - the ms until the first permit
     expires (and sets the waiters mark). */
  ERA_FN
  NOW
  "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
  "local resent = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
  "if resent or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then\n"
  "  redis.call('ZADD', KEYS[1], " FMT "now + tonumber(ARGV[2])), ARGV[1])\n"
  ZSET_EXPIRE("KEYS[1]")
  FENCE_OF("KEYS[2]", "KEYS[4]", "resent")
  "end\n"
  "local left = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]) - now\n"
  "redis.call('SET', KEYS[3], 1, 'PX', " FMT "math.max(left, 0) + " RL_STR(RL_WAITERS_SLACK_MS) "))\n"
  "return -2 - left\n",
  /* RL_OP_SEM_RELEASE: KEYS permits, signal, waiters; ARGV[1] token. Wakes
     one waiter when the mark says somebody may wait. Replies 1, or 0 when
     the permit is gone (expired, or taken back). */
  NOW
  "local s = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
  "if not s then return 0 end\n"
  "redis.call('ZREM', KEYS[1], ARGV[1])\n"
  "if tonumber(s) <= now then return 0 end\n"
  "if redis.call('EXISTS', KEYS[3]) == 1 then pcall(function()\n"
  "  redis.call('DEL', KEYS[2])\n"
  "  redis.call('RPUSH', KEYS[2], 1)\n"
  "  redis.call('PEXPIRE', KEYS[2], " RL_STR(RL_SIGNAL_MS) ")\n"
  "end) end\n"
  "return 1\n",
  /* RL_OP_SEM_EXTEND: KEYS permits; ARGV[1] token, ARGV[2] ttl (ms) */
  ZSET_EXTEND,
  /* RL_OP_SEM_PTTL: KEYS permits; ARGV[1] token */
  ZSET_PTTL,
  /* RL_OP_SEM_COUNT: KEYS permits. Replies {1, permits held now}. */
  NOW
  "return {1, redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')}\n",
  /* RL_OP_READ_ACQUIRE: KEYS readers, writer, fence, writers, waiters, era;
     ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] how long a waiting writer
     stays queued (ms). A reader gets in when no writer holds the lock and
     none waits (writers first: a stream of readers cannot starve one).
     Replies as acquire: the fence, or -2 - ms until it may change (the
     writer's PTTL, or the last waiting writer's stay). */
  ERA_FN
  NOW
  "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
  "redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)\n"
  "local resent = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
  "local wleft = redis.call('PTTL', KEYS[2])\n"
  "if resent or (wleft == -2 and redis.call('ZCARD', KEYS[4]) == 0) then\n"
  "  redis.call('ZADD', KEYS[1], " FMT "now + tonumber(ARGV[2])), ARGV[1])\n"
  ZSET_EXPIRE("KEYS[1]")
  "  redis.call('ZREM', KEYS[5], ARGV[1])\n"
  FENCE_OF("KEYS[3]", "KEYS[6]", "resent")
  "end\n"
  "local left = wleft\n"
  "if left < 0 then\n"
  "  local w = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]\n"
  "  left = w and tonumber(w) - now or tonumber(ARGV[3])\n"
  "end\n"
  RW_MARK("KEYS[5]")
  "return -2 - left\n",
  /* RL_OP_READ_RELEASE: KEYS readers, signal, waiters; ARGV[1] token. The
     last reader out wakes every waiter. Replies as sem_release. */
  NOW
  "local s = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
  "if not s then return 0 end\n"
  "redis.call('ZREM', KEYS[1], ARGV[1])\n"
  "if tonumber(s) <= now then return 0 end\n"
  "if redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') == 0 and redis.call('EXISTS', KEYS[3]) == 1 then\n"
  "  pcall(function()\n"
  WAKE_ALL("KEYS[2]", "KEYS[3]")
  "  end)\n"
  "end\n"
  "return 1\n",
  /* RL_OP_READ_EXTEND: KEYS readers; ARGV[1] token, ARGV[2] ttl (ms) */
  ZSET_EXTEND,
  /* RL_OP_READ_PTTL: KEYS readers; ARGV[1] token */
  ZSET_PTTL,
  /* RL_OP_WRITE_ACQUIRE: KEYS readers, writer, fence, writers, waiters, era;
     ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] stay (ms). Takes the writer
     key when no writer holds it and no reader does; else queues the token
     among the waiting writers for the stay (which keeps new readers out).
     Replies as acquire: the fence, or -2 - ms until it may change (the
     writer's PTTL, or the last reader's expiry). */
  ERA_FN
  NOW
  "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
  "redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)\n"
  "local v = redis.call('GET', KEYS[2])\n"
  "if v == ARGV[1] or (not v and redis.call('ZCARD', KEYS[1]) == 0) then\n"
  "  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])\n"
  "  redis.call('ZREM', KEYS[4], ARGV[1])\n"
  "  redis.call('ZREM', KEYS[5], ARGV[1])\n"
  FENCE_OF("KEYS[3]", "KEYS[6]", "v")
  "end\n"
  "redis.call('ZADD', KEYS[4], " FMT "now + tonumber(ARGV[3])), ARGV[1])\n"
  "redis.call('PEXPIRE', KEYS[4], ARGV[3])\n"
  "local left\n"
  "if v then left = redis.call('PTTL', KEYS[2]) else\n"
  "  left = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2]) - now\n"
  "end\n"
  RW_MARK("KEYS[5]")
  "return -2 - left\n",
  /* RL_OP_WRITE_RELEASE: KEYS writer, signal, waiters; ARGV[1] token.
     Compare-and-delete; wakes every waiter. Replies as release. */
  "local v = redis.call('GET', KEYS[1])\n"
  "if v == ARGV[1] then\n"
  "  redis.call('DEL', KEYS[1])\n"
  "  if redis.call('EXISTS', KEYS[3]) == 1 then pcall(function()\n"
  NOW
  WAKE_ALL("KEYS[2]", "KEYS[3]")
  "  end) end\n"
  "  return 1\n"
  "end\n"
  "if v then return -2 - redis.call('PTTL', KEYS[1]) end\n"
  "return 0\n",
  /* RL_OP_WRITE_EXTEND: KEYS writer; ARGV[1] token, ARGV[2] ttl (ms) */
  KEY_EXTEND,
  /* RL_OP_WRITE_PTTL: KEYS writer; ARGV[1] token */
  KEY_PTTL,
  /* RL_OP_WRITE_LEAVE: KEYS writers, writer, signal, waiters; ARGV[1]
     token. A waiting writer gives up: it leaves the queue, and when no
     writer holds the lock the waiters are woken (readers it kept out). */
  "redis.call('ZREM', KEYS[1], ARGV[1])\n"
  "if redis.call('EXISTS', KEYS[2]) == 0 then\n"
  NOW
  WAKE_ALL("KEYS[3]", "KEYS[4]")
  "end\n"
  "return {0, 0}\n",
};

static const char *const op_name[RL_OP_COUNT] = {
  "acquire", "release", "extend", "pttl", "acquire_fair", "leave", "take", "release_one", "fence_up",
  "sem_acquire", "sem_release", "sem_extend", "sem_pttl", "sem_count",
  "read_acquire", "read_release", "read_extend", "read_pttl",
  "write_acquire", "write_release", "write_extend", "write_pttl", "write_leave"
};

static char script_sha[RL_OP_COUNT][41];
static pthread_once_t script_sha_once = PTHREAD_ONCE_INIT;

const char *rl_script_text(rl_op op) { return script_text[op == RL_OP_TAKE ? RL_OP_ACQUIRE : op]; }

const char *rl_op_name(rl_op op) { return op_name[op]; }

/* The multi-key acquire: KEYS the n locks, then their n fence counters, then
   their n waiters marks, then their n era records (4n keys); ARGV[1] token,
   ARGV[2] ttl (ms). All n
   locks are taken, or none: when one holds another owner's token, it marks
   that lock's waiters and replies {-1, its PTTL, its index}; else
   {1, {fence, ...}}. Resend-safe as acquire: a lock that holds our token
   already keeps its fence. The keys are sent in Lua's order (sorted), which
   only matters for which busy lock is named. */
static const char multi_acquire[] =
  ERA_FN
  "local n = #KEYS / 4\n"
  "local mine = {}\n"
  "for i = 1, n do\n"
  "  local v = redis.call('GET', KEYS[i])\n"
  "  if v and v ~= ARGV[1] then\n"
  "    local left = redis.call('PTTL', KEYS[i])\n"
  "    redis.call('SET', KEYS[2 * n + i], 1, 'PX', math.max(left, 0) + " RL_STR(RL_WAITERS_SLACK_MS) ")\n"
  "    return {-1, left, i}\n"
  "  end\n"
  "  mine[i] = v\n"
  "end\n"
  "local fences = {}\n"
  "for i = 1, n do\n"
  "  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])\n"
  "  local fence = mine[i] and tonumber(redis.call('GET', KEYS[n + i]))\n"
  "  if not fence or fence < 1 then fence = redis.call('INCR', KEYS[n + i]) end\n"
  "  fences[i] = fence + era(KEYS[3 * n + i])\n"
  "end\n"
  "return {1, fences}\n";

/* inspect: KEYS lock, fence, era. What an operator asks about a lock, in
   one step: {value or false, PTTL, the last fence or false}; the fence with
   the offset the era record holds (not checked against INFO: it writes
   nothing). */
static const char inspect[] =
  "local v = redis.call('GET', KEYS[1])\n"
  "local fence = tonumber(redis.call('GET', KEYS[2]))\n"
  "local r = redis.call('GET', KEYS[3])\n"
  "local off = r and tonumber(string.match(r, ' (%d+)$')) or 0\n"
  "return {v, redis.call('PTTL', KEYS[1]), fence and " FMT "fence + off) or false}\n";

/* force_release: KEYS lock, signal, queue, alive, waiters. Deletes the lock
   whoever holds it, and wakes one waiter as a release does; the fence counter
   stays, so fences keep growing. Replies 1, or 0 when there was no lock. */
static const char force_release[] =
  "if redis.call('DEL', KEYS[1]) == 0 then return 0 end\n"
  "if redis.call('EXISTS', KEYS[5]) == 1 then pcall(function()\n"
  PRUNE_QUEUE("KEYS[3]", "KEYS[4]")
  SIGNAL_ONE("KEYS[2]", "KEYS[3]")
  "end) end\n"
  "return 1\n";

/* Guarded writes (redislock/guard.lua). Defines write(k, a): the write
   ARGV[a] ("set", "hset", "incrby", "del", "rpush") on KEYS[k] (del: KEYS[k]
   and after) with ARGV[a + 1] and after as its arguments (set: the value,
   then the TTL in ms or nothing); returns the write's reply (set: 1). */
#define WRITE_FN                                                           \
  "local function write(k, a)\n"                                           \
  "  local w = ARGV[a]\n"                                                  \
  "  if w == 'set' then\n"                                                 \
  "    if ARGV[a + 2] then redis.call('SET', KEYS[k], ARGV[a + 1], 'PX', ARGV[a + 2])\n" \
  "    else redis.call('SET', KEYS[k], ARGV[a + 1]) end\n"                 \
  "    return 1\n"                                                         \
  "  elseif w == 'hset' then return redis.call('HSET', KEYS[k], unpack(ARGV, a + 1))\n" \
  "  elseif w == 'incrby' then return redis.call('INCRBY', KEYS[k], ARGV[a + 1])\n" \
  "  elseif w == 'del' then return redis.call('DEL', unpack(KEYS, k))\n"   \
  "  elseif w == 'rpush' then return redis.call('RPUSH', KEYS[k], unpack(ARGV, a + 1))\n" \
  "  end\n"                                                                \
  "  error('redislock: no write ' .. tostring(w))\n"                       \
  "end\n"

/* fenced_write: KEYS the resource's fence record, then the resource's keys;
   ARGV[1] the hold's fence, then the write (see WRITE_FN). The write is
   applied only when the fence is at least the highest the record accepted
   (which it then becomes): {1, the write's reply}; else {0, that highest
   fence}. The write is one command, done or refused whole; the record is
   written after it, so that a write the server refuses (WRONGTYPE ...)
   leaves the record as it was. It never expires. */
static const char fenced_write[] =
  WRITE_FN
  "local top = redis.call('GET', KEYS[1])\n"
  "if top and tonumber(top) > tonumber(ARGV[1]) then return {0, top} end\n"
  "local r = write(2, 2)\n"
  "if top ~= ARGV[1] then redis.call('SET', KEYS[1], ARGV[1]) end\n"
  "return {1, r}\n";

/* The owner check of owned_write, on KEYS[1] with ARGV[1] the token and
   ARGV[2] how the hold is kept: "string" (a lock, a write lock: the key
   holds the token) or "zset" (a semaphore's permits: the token is a member
   whose score, its expiry on the server's clock, is still ahead). */
#define OWNER_CHECK                                                        \
  "local held\n"                                                           \
  "if ARGV[2] == 'zset' then\n"                                            \
  NOW                                                                      \
  "  local s = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"                   \
  "  held = s and tonumber(s) > now\n"                                     \
  "else\n"                                                                 \
  "  held = redis.call('GET', KEYS[1]) == ARGV[1]\n"                       \
  "end\n"                                                                  \
  "if not held then return {0} end\n"

/* owned_write: KEYS the hold's key (see OWNER_CHECK), then the resource's
   keys; ARGV[1] the token, ARGV[2] how the hold is kept, then the write.
   Applied only while the hold is ours: {1, the write's reply}; else {0}. */
static const char owned_write[] =
  WRITE_FN
  OWNER_CHECK
  "return {1, write(2, 3)}\n";

/* A user's script run under a guard (redislock/guard.lua's eval): the
   head and tail around its text, fenced (the check and record of
   fenced_write) or owned (owned_write's owner check). The user's script
   runs as a function of its own KEYS and ARGV (those after the guard's);
   its reply comes back as the second element. Fenced, the record is
   written before the script runs: Redis keeps what a script wrote before
   it failed, and that must stay guarded by this fence. */
static const char user_fenced_head[] =
  "local top = redis.call('GET', KEYS[1])\n"
  "if top and tonumber(top) > tonumber(ARGV[1]) then return {0, top} end\n"
  "if top ~= ARGV[1] then redis.call('SET', KEYS[1], ARGV[1]) end\n"
  "local function user(KEYS, ARGV)\n";
static const char user_fenced_tail[] =
  "\nend\n"
  "local keys, argv = {}, {}\n"
  "for i = 2, #KEYS do keys[i - 1] = KEYS[i] end\n"
  "for i = 2, #ARGV do argv[i - 1] = ARGV[i] end\n"
  "return {1, user(keys, argv)}\n";
static const char user_owned_head[] =
  OWNER_CHECK
  "local function user(KEYS, ARGV)\n";
static const char user_owned_tail[] =
  "\nend\n"
  "local keys, argv = {}, {}\n"
  "for i = 2, #KEYS do keys[i - 1] = KEYS[i] end\n"
  "for i = 3, #ARGV do argv[i - 2] = ARGV[i] end\n"
  "return {1, user(keys, argv)}\n";

void rl_guard_parts(int owned, const char **head, const char **tail) {
  *head = owned ? user_owned_head : user_fenced_head;
  *tail = owned ? user_owned_tail : user_fenced_tail;
}

/* The scripts not sent through rl_cmd, by name, with their SHA-1s. */
static struct {
  const char *name, *text;
  char sha[41];
} extra[] = {
  { "multi_acquire", multi_acquire, "" },
  { "inspect", inspect, "" },
  { "force_release", force_release, "" },
  { "fenced_write", fenced_write, "" },
  { "owned_write", owned_write, "" },
};
#define NEXTRA (sizeof extra / sizeof extra[0])

/* Names every script, the ops' and the extra ones, once per process (Lua
   states in several threads may load the module at the same time). */
static void compute_script_shas(void) {
  size_t i;
  int op;
  for (op = 0; op < RL_OP_COUNT; op++)
    if (script_text[op] != NULL) rl_sha1_hex(script_text[op], strlen(script_text[op]), script_sha[op]);
  for (i = 0; i < NEXTRA; i++) rl_sha1_hex(extra[i].text, strlen(extra[i].text), extra[i].sha);
}

const char *rl_extra_script(int i, const char **name, const char **sha) {
  pthread_once(&script_sha_once, compute_script_shas);
  if (i < 0 || (size_t)i >= NEXTRA) return NULL;
  *name = extra[i].name;
  *sha = extra[i].sha;
  return extra[i].text;
}

const char *rl_script_sha(rl_op op) {
  pthread_once(&script_sha_once, compute_script_shas);
  return script_sha[op == RL_OP_TAKE ? RL_OP_ACQUIRE : op];
}

/* The names of the scripts' keys, as indexes into rl_cmd.key/klen, and
   their suffixes after "<prefix>{<key>}". Each primitive has names of its
   own: a semaphore and a lock of the same name do not meet. */
enum { K_LOCK, K_FENCE, K_SIGNAL, K_QUEUE, K_ALIVE, K_WAITERS,
       K_PERMITS, K_PFENCE, K_PSIGNAL, K_PWAITERS,
       K_READERS, K_WRITER, K_RWFENCE, K_WRITERS, K_RWSIGNAL, K_RWWAITERS,
       K_ERA /* the slot's era record: "<prefix>{<era tag>}:era", not the key's */ };
static const char *const suffix[RL_NAMES] = {
  "", ":fence", ":signal", ":queue", ":alive", ":waiters",
  ":permits", ":permits:fence", ":permits:signal", ":permits:waiters",
  ":rw:readers", ":rw:writer", ":rw:fence", ":rw:writers", ":rw:signal", ":rw:waiters",
  ":era"
};
static const int op_keys[RL_OP_COUNT][RL_MAX_KEYS + 1] = { /* ends with -1 */
  [RL_OP_ACQUIRE] = { K_LOCK, K_FENCE, K_WAITERS, K_ERA, -1 },
  [RL_OP_RELEASE] = { K_LOCK, K_SIGNAL, K_QUEUE, K_ALIVE, K_WAITERS, -1 },
  [RL_OP_EXTEND] = { K_LOCK, -1 },
  [RL_OP_PTTL] = { K_LOCK, -1 },
  [RL_OP_ACQUIRE_FAIR] = { K_LOCK, K_FENCE, K_QUEUE, K_ALIVE, K_WAITERS, K_ERA, -1 },
  [RL_OP_LEAVE] = { K_LOCK, K_SIGNAL, K_QUEUE, K_ALIVE, -1 },
  [RL_OP_TAKE] = { K_LOCK, K_FENCE, K_WAITERS, K_ERA, -1 }, /* acquire's, for the fallback */
  [RL_OP_RELEASE_ONE] = { K_LOCK, -1 },
  [RL_OP_FENCE_UP] = { K_LOCK, K_FENCE, K_ERA, -1 },
  [RL_OP_SEM_ACQUIRE] = { K_PERMITS, K_PFENCE, K_PWAITERS, K_ERA, -1 },
  [RL_OP_SEM_RELEASE] = { K_PERMITS, K_PSIGNAL, K_PWAITERS, -1 },
  [RL_OP_SEM_EXTEND] = { K_PERMITS, -1 },
  [RL_OP_SEM_PTTL] = { K_PERMITS, -1 },
  [RL_OP_SEM_COUNT] = { K_PERMITS, -1 },
  [RL_OP_READ_ACQUIRE] = { K_READERS, K_WRITER, K_RWFENCE, K_WRITERS, K_RWWAITERS, K_ERA, -1 },
  [RL_OP_READ_RELEASE] = { K_READERS, K_RWSIGNAL, K_RWWAITERS, -1 },
  [RL_OP_READ_EXTEND] = { K_READERS, -1 },
  [RL_OP_READ_PTTL] = { K_READERS, -1 },
  [RL_OP_WRITE_ACQUIRE] = { K_READERS, K_WRITER, K_RWFENCE, K_WRITERS, K_RWWAITERS, K_ERA, -1 },
  [RL_OP_WRITE_RELEASE] = { K_WRITER, K_RWSIGNAL, K_RWWAITERS, -1 },
  [RL_OP_WRITE_EXTEND] = { K_WRITER, -1 },
  [RL_OP_WRITE_PTTL] = { K_WRITER, -1 },
  [RL_OP_WRITE_LEAVE] = { K_WRITERS, K_WRITER, K_RWSIGNAL, K_RWWAITERS, -1 },
};

int rl_op_takes_ms(rl_op op) {
  switch (op) {
  case RL_OP_ACQUIRE: case RL_OP_TAKE: case RL_OP_EXTEND: case RL_OP_ACQUIRE_FAIR: case RL_OP_FENCE_UP:
  case RL_OP_SEM_ACQUIRE: case RL_OP_SEM_EXTEND: case RL_OP_READ_ACQUIRE: case RL_OP_READ_EXTEND:
  case RL_OP_WRITE_ACQUIRE: case RL_OP_WRITE_EXTEND:
    return 1;
  default:
    return 0;
  }
}

int rl_op_takes_n(rl_op op) { return op == RL_OP_SEM_ACQUIRE; }

int rl_op_resendable(rl_op op) {
  return op != RL_OP_RELEASE && op != RL_OP_RELEASE_ONE && op != RL_OP_SEM_RELEASE && op != RL_OP_READ_RELEASE &&
         op != RL_OP_WRITE_RELEASE;
}

/* The wake-up list of the primitive op belongs to. */
static int signal_of(rl_op op) {
  int i;
  for (i = 0; op_keys[op][i] >= 0; i++) {
    int k = op_keys[op][i];
    if (k == K_ERA) continue;
    if (k >= K_READERS) return K_RWSIGNAL;
    if (k >= K_PERMITS) return K_PSIGNAL;
  }
  return K_SIGNAL;
}

/* Whether op waits with a stay: a fair waiter, or a waiting writer, that
   leaves the queue unless it comes back within RL_FAIR_STAY_MS. */
static int takes_stay(rl_op op) {
  return op == RL_OP_ACQUIRE_FAIR || op == RL_OP_READ_ACQUIRE || op == RL_OP_WRITE_ACQUIRE;
}

/* Writes n in decimal at p; returns the end. */
static char *put_size(char *p, size_t n) {
  char tmp[24];
  int i = 0;
  do tmp[i++] = (char)('0' + n % 10);
  while ((n /= 10) != 0);
  while (i > 0) *p++ = tmp[--i];
  return p;
}

int rl_cmd_init(rl_cmd *cmd, rl_op op, const char *prefix, size_t plen,
                const char *key, size_t klen, const char *token, size_t tlen,
                long long ms, long long n) {
  size_t base = plen + klen + 2, total = 0;
  const char *tag = NULL;
  char *p;
  int i, k;
  memset(cmd, 0, offsetof(rl_cmd, inline_keys));
  cmd->op = op;
  for (i = 0; (k = op_keys[op][i]) >= 0; i++) {
    if (k == K_ERA) {
      tag = rl_era_tag(rl_lock_slot(key, klen));
      total += plen + strlen(tag) + 2 + strlen(suffix[k]);
    } else {
      total += base + strlen(suffix[k]);
    }
  }
  cmd->keys = p = total <= sizeof cmd->inline_keys ? cmd->inline_keys : (char *)malloc(total);
  if (p == NULL) return -1;
  /* "<prefix>{<key>}" then each name the op uses with its suffix, one after
     another; the era record's hash tag is its slot's tag, not the key */
  for (i = 0; (k = op_keys[op][i]) >= 0; i++) {
    const char *tagged = k == K_ERA ? tag : key;
    size_t taglen = k == K_ERA ? strlen(tag) : klen, slen = strlen(suffix[k]);
    cmd->key[k] = p;
    cmd->klen[k] = plen + taglen + 2 + slen;
    memcpy(p, prefix, plen);
    p[plen] = '{';
    memcpy(p + plen + 1, tagged, taglen);
    p[plen + 1 + taglen] = '}';
    memcpy(p + plen + 2 + taglen, suffix[k], slen);
    p += cmd->klen[k];
  }

  cmd->argv[0] = "EVALSHA";
  cmd->argv[1] = rl_script_sha(op); /* a take's: acquire's */
  cmd->argc = 3;
  for (i = 0; op_keys[op][i] >= 0; i++) {
    cmd->argv[cmd->argc] = cmd->key[op_keys[op][i]];
    cmd->len[cmd->argc++] = cmd->klen[op_keys[op][i]];
  }
  cmd->numkeys[0] = (char)('0' + i);
  cmd->argv[2] = cmd->numkeys;
  cmd->len[2] = 1;
  cmd->argv[cmd->argc] = token;
  cmd->len[cmd->argc++] = tlen;
  if (rl_op_takes_ms(op)) {
    cmd->len[cmd->argc] = (size_t)(put_size(cmd->ms, (size_t)ms) - cmd->ms); /* ms >= 1, checked */
    cmd->argv[cmd->argc++] = cmd->ms;
  }
  if (rl_op_takes_n(op)) {
    cmd->len[cmd->argc] = (size_t)(put_size(cmd->n, (size_t)n) - cmd->n); /* n >= 1, checked */
    cmd->argv[cmd->argc++] = cmd->n;
  }
  if (takes_stay(op)) {
    cmd->argv[cmd->argc] = RL_STR(RL_FAIR_STAY_MS);
    cmd->len[cmd->argc++] = strlen(RL_STR(RL_FAIR_STAY_MS));
  }
  cmd->len[0] = strlen(cmd->argv[0]);
  cmd->len[1] = strlen(cmd->argv[1]);
  return 0;
}

int rl_wait_init(rl_cmd *cmd, rl_op op, const char *prefix, size_t plen, const char *key, size_t klen,
                 const char *token, size_t tlen, long long ms) {
  const char *signal = suffix[signal_of(op)];
  size_t slen = strlen(signal);
  size_t base = plen + klen + 2 + slen;
  size_t len = base + (token != NULL ? 1 + tlen : 0);
  char *p;
  memset(cmd, 0, offsetof(rl_cmd, inline_keys));
  cmd->op = RL_OP_COUNT; /* not a script */
  cmd->keys = p = len <= sizeof cmd->inline_keys ? cmd->inline_keys : (char *)malloc(len);
  if (p == NULL) return -1;
  memcpy(p, prefix, plen);
  p[plen] = '{';
  memcpy(p + plen + 1, key, klen);
  p[plen + 1 + klen] = '}';
  memcpy(p + plen + 2 + klen, signal, slen);
  if (token != NULL) {
    p[base] = ':';
    memcpy(p + base + 1, token, tlen);
  }
  if (ms < 1) ms = 1; /* BLPOP 0 would block for ever */
  cmd->argv[0] = "BLPOP";
  cmd->len[0] = 5;
  cmd->argv[1] = p;
  cmd->len[1] = len;
  {
    char *e = put_size(cmd->ms, (size_t)(ms / 1000)); /* seconds with a fraction, "%lld.%03lld" */
    *e++ = '.';
    *e++ = (char)('0' + ms % 1000 / 100), *e++ = (char)('0' + ms % 100 / 10), *e++ = (char)('0' + ms % 10);
    cmd->len[2] = (size_t)(e - cmd->ms);
  }
  cmd->argv[2] = cmd->ms;
  cmd->argc = 3;
  return 0;
}

/* Decimal digits of n. */
static size_t digits(size_t n) {
  size_t d = 1;
  while (n >= 10) n /= 10, d++;
  return d;
}

long long rl_format(char *buf, size_t cap, char **out, int argc, const char *const *argv, const size_t *len) {
  size_t total = 1 + digits((size_t)argc) + 2;
  char *p;
  for (int i = 0; i < argc; i++) total += 1 + digits(len[i]) + 2 + len[i] + 2;
  p = total <= cap ? buf : (char *)malloc(total);
  if (p == NULL) return -1;
  *out = p;
  *p++ = '*';
  p = put_size(p, (size_t)argc);
  *p++ = '\r', *p++ = '\n';
  for (int i = 0; i < argc; i++) {
    *p++ = '$';
    p = put_size(p, len[i]);
    *p++ = '\r', *p++ = '\n';
    if (len[i] > 0) memcpy(p, argv[i], len[i]);
    p += len[i];
    *p++ = '\r', *p++ = '\n';
  }
  return (long long)total;
}

/* Writes "$<len>\r\n<bytes>\r\n" at p; returns the end. */
static char *put_bulk(char *p, const char *bytes, size_t len) {
  *p++ = '$';
  p = put_size(p, len);
  *p++ = '\r', *p++ = '\n';
  memcpy(p, bytes, len);
  p += len;
  *p++ = '\r', *p++ = '\n';
  return p;
}

/* A take's bytes: its five or six commands, in one buffer (the caller frees
   *out when it is not buf). The argv of a take is acquire's EVALSHA sha 4
   lock fence waiters era token ms. */
static long long take_bytes(const rl_cmd *cmd, char *buf, size_t cap, char **out) {
  static const char multi[] = "*1\r\n$5\r\nMULTI\r\n", set_head[] = "*6\r\n$3\r\nSET\r\n";
  static const char set_tail[] = "$2\r\nNX\r\n$2\r\nPX\r\n", incr[] = "*2\r\n$4\r\nINCR\r\n";
  static const char get[] = "*2\r\n$3\r\nGET\r\n";
  static const char getname[] = "*2\r\n$6\r\nCLIENT\r\n$7\r\nGETNAME\r\n", exec[] = "*1\r\n$4\r\nEXEC\r\n";
  const char *token = cmd->argv[7], *ms = cmd->argv[8];
  size_t tlen = cmd->len[7], mlen = cmd->len[8], named = cmd->ask_name ? sizeof getname - 1 : 0;
  size_t lock = cmd->klen[K_LOCK], fence = cmd->klen[K_FENCE], era = cmd->klen[K_ERA];
  size_t total = sizeof multi - 1 + sizeof set_head - 1 + 1 + digits(lock) + 2 + lock + 2 +
                 1 + digits(tlen) + 2 + tlen + 2 + sizeof set_tail - 1 + 1 + digits(mlen) + 2 + mlen + 2 +
                 sizeof incr - 1 + 1 + digits(fence) + 2 + fence + 2 +
                 sizeof get - 1 + 1 + digits(era) + 2 + era + 2 + named + sizeof exec - 1;
  char *p = total <= cap ? buf : (char *)malloc(total);
  if (p == NULL) return -1;
  *out = p;
  memcpy(p, multi, sizeof multi - 1), p += sizeof multi - 1;
  memcpy(p, set_head, sizeof set_head - 1), p += sizeof set_head - 1;
  p = put_bulk(p, cmd->key[K_LOCK], lock);
  p = put_bulk(p, token, tlen);
  memcpy(p, set_tail, sizeof set_tail - 1), p += sizeof set_tail - 1;
  p = put_bulk(p, ms, mlen);
  memcpy(p, incr, sizeof incr - 1), p += sizeof incr - 1;
  p = put_bulk(p, cmd->key[K_FENCE], fence);
  memcpy(p, get, sizeof get - 1), p += sizeof get - 1;
  p = put_bulk(p, cmd->key[K_ERA], era);
  memcpy(p, getname, named), p += named;
  memcpy(p, exec, sizeof exec - 1);
  return (long long)total;
}

long long rl_cmd_bytes(const rl_cmd *cmd, char *buf, size_t cap, char **out) {
  if (cmd->op == RL_OP_TAKE) return take_bytes(cmd, buf, cap, out);
  return rl_format(buf, cap, out, cmd->argc, cmd->argv, cmd->len);
}

int rl_cmd_replies(const rl_cmd *cmd) {
  if (cmd->op != RL_OP_TAKE) return 1;
  return cmd->ask_name ? RL_TAKE_REPLIES : RL_TAKE_REPLIES - 1;
}

size_t rl_setname_bytes(const char *era, char *buf) {
  static const char head[] = "*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n";
  char name[sizeof RL_ERA_NAME + RL_REPLID_LEN];
  size_t n = strlen(era);
  char *p = buf;
  if (n > RL_REPLID_LEN) n = RL_REPLID_LEN;
  memcpy(name, RL_ERA_NAME, sizeof RL_ERA_NAME - 1);
  memcpy(name + sizeof RL_ERA_NAME - 1, era, n);
  memcpy(p, head, sizeof head - 1), p += sizeof head - 1;
  p = put_bulk(p, name, sizeof RL_ERA_NAME - 1 + n);
  return (size_t)(p - buf);
}

/*
 * The era tags: for each hash slot, the first string in the sequence "0",
 * "1", ..., "z", "00", "01", ... (digits and lower-case letters, shortest
 * first) whose slot it is. Every slot has one of at most four characters.
 * Computed once per process; never change them (the records would move).
 */
static char era_tags[RL_SLOTS][5];
static pthread_once_t era_once = PTHREAD_ONCE_INIT;

static unsigned crc16(const char *buf, size_t len);

static void compute_era_tags(void) {
  static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  int left = RL_SLOTS;
  for (size_t len = 1; len <= 4 && left > 0; len++) {
    size_t count = 1;
    for (size_t i = 0; i < len; i++) count *= 36;
    for (size_t n = 0; n < count && left > 0; n++) {
      char s[5];
      size_t v = n;
      int slot;
      for (size_t i = len; i-- > 0; v /= 36) s[i] = alphabet[v % 36];
      slot = (int)(crc16(s, len) & (RL_SLOTS - 1));
      if (era_tags[slot][0] != '\0') continue;
      memcpy(era_tags[slot], s, len);
      left--;
    }
  }
}

const char *rl_era_tag(int slot) {
  pthread_once(&era_once, compute_era_tags);
  return era_tags[slot & (RL_SLOTS - 1)];
}

void rl_cmd_use_acquire(rl_cmd *cmd) {
  if (cmd->op == RL_OP_TAKE) cmd->op = RL_OP_ACQUIRE; /* argv is acquire's already */
}

int rl_cmd_claim(rl_cmd *cmd, const char *era) {
  size_t n = strlen(era);
  if (cmd->op != RL_OP_ACQUIRE || n != RL_REPLID_LEN || cmd->argc >= RL_CMD_MAXARGS) return -1;
  memcpy(cmd->era, era, n + 1);
  cmd->argv[cmd->argc] = cmd->era;
  cmd->len[cmd->argc++] = n;
  return 0;
}

void rl_cmd_use_eval(rl_cmd *cmd) {
  rl_cmd_use_acquire(cmd);
  cmd->argv[0] = "EVAL";
  cmd->len[0] = 4;
  cmd->argv[1] = script_text[cmd->op];
  cmd->len[1] = strlen(script_text[cmd->op]);
}

void rl_cmd_free(rl_cmd *cmd) {
  if (cmd->keys != cmd->inline_keys) free(cmd->keys);
  cmd->keys = NULL;
}

/* Copies what (len bytes) into err as a C string; returns RL_ERROR. */
static rl_decoded fail(char *err, size_t errlen, const char *what, size_t len) {
  if (errlen > 0) snprintf(err, errlen, "%.*s", (int)len, what);
  return RL_ERROR;
}

void rl_read_error(int err, const char *errstr, const char *where, char *out, size_t len) {
  /* hiredis 0.14's reader keeps a fixed stack of 8 levels (REDIS_ERR_PROTOCOL). */
  if (err == REDIS_ERR_PROTOCOL && strstr(errstr, "nested") != NULL)
    snprintf(out, len, "redis: the reply%s%s nests arrays deeper than hiredis 0.14 can read"
             " (8 levels at most; %s)", where ? " of " : "", where ? where : "", errstr);
  else if (where != NULL)
    snprintf(out, len, "connection: lost %s (%s)", where, errstr);
  else
    snprintf(out, len, "connection: the server's reply is not RESP (%s)", errstr);
}

/* Reads ":<integer>\r\n" at *p (before end) into *v, moving *p past it; 0 or -1. */
static int read_int_line(const char **p, const char *end, long long *v) {
  const char *s = *p;
  int neg = 0, nd = 0;
  unsigned long long n = 0;
  if (s >= end || *s++ != ':') return -1;
  if (s < end && *s == '-') neg = 1, s++;
  while (s < end && *s >= '0' && *s <= '9') {
    if (++nd > 18) return -1; /* leave the rare giant to the reader */
    n = n * 10 + (unsigned)(*s++ - '0');
  }
  if (nd == 0 || end - s < 2 || s[0] != '\r' || s[1] != '\n') return -1;
  *v = neg ? -(long long)n : (long long)n;
  *p = s + 2;
  return 0;
}

/* A script's one-integer reply n as a result (see rl_result). */
static void from_integer(long long n, rl_result *out) {
  out->status = n >= 1 ? RL_HELD : n == 0 ? RL_FREE : RL_OTHER;
  out->value = n >= 1 ? n : n == 0 ? 0 : -n - 2;
}

/*
 * A take's result from what its transaction answered: held (SET took the
 * lock), n (INCR's), the era record (rlen bytes at rec, NULL when none) and
 * the connection's name (nlen bytes at name, NULL when none or not asked).
 * See "Fences across failovers": the fence is n plus the record's offset
 * when the record's master ID is vouched for, by the name (RL_ERA_NAME and
 * the ID) or by the caller (rl_take_vouch).
 */
static void take_result(int held, long long n, const char *rec, size_t rlen, const char *name, size_t nlen,
                        rl_result *out) {
  static const char hex[] = "0123456789abcdef";
  size_t i, pre = sizeof RL_ERA_NAME - 1;
  long long off = 0;
  int id_ok = rec != NULL && rlen > RL_REPLID_LEN + 1 && rec[RL_REPLID_LEN] == ' ';
  out->era[0] = '\0';
  out->offset = 0;
  if (!held) {
    out->status = RL_OTHER;
    out->value = RL_PTTL_UNKNOWN;
    return;
  }
  for (i = 0; id_ok && i < RL_REPLID_LEN; i++) id_ok = memchr(hex, rec[i], 16) != NULL;
  for (i = RL_REPLID_LEN + 1; id_ok && i < rlen; i++) {
    id_ok = rec[i] >= '0' && rec[i] <= '9' && i < RL_REPLID_LEN + 17; /* 16 digits at most */
    off = off * 10 + (rec[i] - '0');
  }
  out->status = RL_UNVERIFIED;
  out->value = n;
  if (!id_ok) return;
  memcpy(out->era, rec, RL_REPLID_LEN);
  out->era[RL_REPLID_LEN] = '\0';
  out->offset = off;
  if (name != NULL && nlen == pre + RL_REPLID_LEN && memcmp(name, RL_ERA_NAME, pre) == 0)
    rl_take_vouch(out, name + pre);
}

void rl_take_vouch(rl_result *out, const char *id) {
  if (out->status != RL_UNVERIFIED || out->era[0] == '\0' || memcmp(id, out->era, RL_REPLID_LEN) != 0) return;
  out->status = RL_HELD;
  out->value += out->offset;
  out->era[0] = '\0';
}

/* Reads "$<len>\r\n<bytes>\r\n" or "$-1\r\n" at *p (before end): *s and
   *slen (*s NULL for the nil), moving *p past it; 0 or -1. */
static int read_bulk(const char **p, const char *end, const char **s, size_t *slen) {
  const char *q = *p;
  size_t n = 0;
  int nd = 0;
  if (end - q >= 5 && memcmp(q, "$-1\r\n", 5) == 0) {
    *s = NULL, *slen = 0, *p = q + 5;
    return 0;
  }
  if (q >= end || *q++ != '$') return -1;
  while (q < end && *q >= '0' && *q <= '9' && nd < 6) n = n * 10 + (size_t)(*q++ - '0'), nd++;
  if (nd == 0 || end - q < 2 || q[0] != '\r' || q[1] != '\n') return -1;
  q += 2;
  if ((size_t)(end - q) < n + 2 || q[n] != '\r' || q[n + 1] != '\n') return -1;
  *s = q, *slen = n, *p = q + n + 2;
  return 0;
}

int rl_decode_bytes(const char *buf, size_t len, int take, rl_result *out) {
  /* MULTI's and the QUEUEDs (two fewer than the replies), then EXEC's array */
  static const char queued[] = "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n";
  const char *p = buf, *end = buf + len;
  long long status, value;
  if (take == RL_TAKE_REPLIES || take == RL_TAKE_REPLIES - 1) {
    const char *rec, *name = NULL;
    size_t rlen, nlen = 0, head = 5 + 9 * (size_t)(take - 2);
    int held;
    if (len < head + 4 + 5 || memcmp(p, queued, head) != 0 || p[head] != '*' ||
        p[head + 1] != '0' + take - 2 || memcmp(p + head + 2, "\r\n", 2) != 0)
      return 0;
    p += head + 4;
    if (memcmp(p, "+OK\r\n", 5) == 0) held = 1;
    else if (memcmp(p, "$-1\r\n", 5) == 0) held = 0;
    else return 0;
    p += 5;
    if (read_int_line(&p, end, &value) != 0 || read_bulk(&p, end, &rec, &rlen) != 0 ||
        (take == RL_TAKE_REPLIES && read_bulk(&p, end, &name, &nlen) != 0) || p != end)
      return 0;
    take_result(held, value, rec, rlen, name, nlen, out);
    return 1;
  }
  if (len > 0 && buf[0] == ':') {
    if (read_int_line(&p, end, &value) != 0 || p != end) return 0;
    from_integer(value, out);
    return 1;
  }
  if (len < 4 || memcmp(buf, "*2\r\n", 4) != 0) return 0;
  p += 4;
  if (read_int_line(&p, end, &status) != 0 || read_int_line(&p, end, &value) != 0 || p != end) return 0;
  if (status < RL_OTHER || status > RL_UNVERIFIED) return 0;
  out->status = (int)status;
  out->value = value;
  return 1;
}

rl_decoded rl_decode(const redisReply *r, rl_result *out, char *err, size_t errlen) {
  static const char bad[] = "unexpected reply to a redislock script";
  if (r->type == REDIS_REPLY_ERROR) {
    if (r->len >= 8 && memcmp(r->str, "NOSCRIPT", 8) == 0) return RL_NOSCRIPT;
    return fail(err, errlen, r->str, r->len);
  }
  if (r->type == REDIS_REPLY_INTEGER) {
    from_integer(r->integer, out);
    return RL_DECODED;
  }
  if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
      r->element[0]->type != REDIS_REPLY_INTEGER ||
      r->element[1]->type != REDIS_REPLY_INTEGER ||
      r->element[0]->integer < RL_OTHER || r->element[0]->integer > RL_UNVERIFIED)
    return fail(err, errlen, bad, sizeof bad - 1);
  out->status = (int)r->element[0]->integer;
  out->value = r->element[1]->integer;
  return RL_DECODED;
}

rl_decoded rl_decode_take(redisReply *const *r, int n, rl_result *out, char *err, size_t errlen) {
  static const char bad[] = "unexpected reply to MULTI/EXEC of a take";
  const redisReply *exec = r[n - 1], *set, *incr, *rec, *name = NULL;
  for (int i = 0; i < n; i++)
    if (r[i]->type == REDIS_REPLY_ERROR) return fail(err, errlen, r[i]->str, r[i]->len);
  if (exec->type != REDIS_REPLY_ARRAY || exec->elements != (size_t)n - 2) /* all but MULTI's and EXEC's */
    return fail(err, errlen, bad, sizeof bad - 1);
  set = exec->element[0], incr = exec->element[1], rec = exec->element[2];
  if (n == RL_TAKE_REPLIES) name = exec->element[3];
  for (size_t i = 0; i < exec->elements; i++) {
    const redisReply *e = exec->element[i];
    if (e->type == REDIS_REPLY_ERROR) return fail(err, errlen, e->str, e->len);
  }
  if (incr->type != REDIS_REPLY_INTEGER || (set->type != REDIS_REPLY_STATUS && set->type != REDIS_REPLY_NIL) ||
      (rec->type != REDIS_REPLY_STRING && rec->type != REDIS_REPLY_NIL) ||
      (name != NULL && name->type != REDIS_REPLY_STRING && name->type != REDIS_REPLY_NIL))
    return fail(err, errlen, bad, sizeof bad - 1);
  if (name != NULL && name->type != REDIS_REPLY_STRING) name = NULL;
  take_result(set->type == REDIS_REPLY_STATUS, incr->integer,
              rec->type == REDIS_REPLY_STRING ? rec->str : NULL, rec->type == REDIS_REPLY_STRING ? rec->len : 0,
              name != NULL ? name->str : NULL, name != NULL ? name->len : 0, out);
  return RL_DECODED;
}

/* CRC16-XMODEM (polynomial 0x1021, initial 0), a byte at a time. */
static const unsigned short crc16_table[256] = {
  0x0000, 0x1021, 0x2042, 0x3063, 0x4084, 0x50a5, 0x60c6, 0x70e7,
  0x8108, 0x9129, 0xa14a, 0xb16b, 0xc18c, 0xd1ad, 0xe1ce, 0xf1ef,
  0x1231, 0x0210, 0x3273, 0x2252, 0x52b5, 0x4294, 0x72f7, 0x62d6,
  0x9339, 0x8318, 0xb37b, 0xa35a, 0xd3bd, 0xc39c, 0xf3ff, 0xe3de,
  0x2462, 0x3443, 0x0420, 0x1401, 0x64e6, 0x74c7, 0x44a4, 0x5485,
  0xa56a, 0xb54b, 0x8528, 0x9509, 0xe5ee, 0xf5cf, 0xc5ac, 0xd58d,
  0x3653, 0x2672, 0x1611, 0x0630, 0x76d7, 0x66f6, 0x5695, 0x46b4,
  0xb75b, 0xa77a, 0x9719, 0x8738, 0xf7df, 0xe7fe, 0xd79d, 0xc7bc,
  0x48c4, 0x58e5, 0x6886, 0x78a7, 0x0840, 0x1861, 0x2802, 0x3823,
  0xc9cc, 0xd9ed, 0xe98e, 0xf9af, 0x8948, 0x9969, 0xa90a, 0xb92b,
  0x5af5, 0x4ad4, 0x7ab7, 0x6a96, 0x1a71, 0x0a50, 0x3a33, 0x2a12,
  0xdbfd, 0xcbdc, 0xfbbf, 0xeb9e, 0x9b79, 0x8b58, 0xbb3b, 0xab1a,
  0x6ca6, 0x7c87, 0x4ce4, 0x5cc5, 0x2c22, 0x3c03, 0x0c60, 0x1c41,
  0xedae, 0xfd8f, 0xcdec, 0xddcd, 0xad2a, 0xbd0b, 0x8d68, 0x9d49,
  0x7e97, 0x6eb6, 0x5ed5, 0x4ef4, 0x3e13, 0x2e32, 0x1e51, 0x0e70,
  0xff9f, 0xefbe, 0xdfdd, 0xcffc, 0xbf1b, 0xaf3a, 0x9f59, 0x8f78,
  0x9188, 0x81a9, 0xb1ca, 0xa1eb, 0xd10c, 0xc12d, 0xf14e, 0xe16f,
  0x1080, 0x00a1, 0x30c2, 0x20e3, 0x5004, 0x4025, 0x7046, 0x6067,
  0x83b9, 0x9398, 0xa3fb, 0xb3da, 0xc33d, 0xd31c, 0xe37f, 0xf35e,
  0x02b1, 0x1290, 0x22f3, 0x32d2, 0x4235, 0x5214, 0x6277, 0x7256,
  0xb5ea, 0xa5cb, 0x95a8, 0x8589, 0xf56e, 0xe54f, 0xd52c, 0xc50d,
  0x34e2, 0x24c3, 0x14a0, 0x0481, 0x7466, 0x6447, 0x5424, 0x4405,
  0xa7db, 0xb7fa, 0x8799, 0x97b8, 0xe75f, 0xf77e, 0xc71d, 0xd73c,
  0x26d3, 0x36f2, 0x0691, 0x16b0, 0x6657, 0x7676, 0x4615, 0x5634,
  0xd94c, 0xc96d, 0xf90e, 0xe92f, 0x99c8, 0x89e9, 0xb98a, 0xa9ab,
  0x5844, 0x4865, 0x7806, 0x6827, 0x18c0, 0x08e1, 0x3882, 0x28a3,
  0xcb7d, 0xdb5c, 0xeb3f, 0xfb1e, 0x8bf9, 0x9bd8, 0xabbb, 0xbb9a,
  0x4a75, 0x5a54, 0x6a37, 0x7a16, 0x0af1, 0x1ad0, 0x2ab3, 0x3a92,
  0xfd2e, 0xed0f, 0xdd6c, 0xcd4d, 0xbdaa, 0xad8b, 0x9de8, 0x8dc9,
  0x7c26, 0x6c07, 0x5c64, 0x4c45, 0x3ca2, 0x2c83, 0x1ce0, 0x0cc1,
  0xef1f, 0xff3e, 0xcf5d, 0xdf7c, 0xaf9b, 0xbfba, 0x8fd9, 0x9ff8,
  0x6e17, 0x7e36, 0x4e55, 0x5e74, 0x2e93, 0x3eb2, 0x0ed1, 0x1ef0,
};

static unsigned crc16(const char *buf, size_t len) {
  unsigned crc = 0;
  for (size_t i = 0; i < len; i++)
    crc = ((crc << 8) & 0xffffu) ^ crc16_table[((crc >> 8) ^ (unsigned char)buf[i]) & 0xffu];
  return crc;
}

int rl_slot(const char *name, size_t len) {
  const char *open = (const char *)memchr(name, '{', len);
  if (open != NULL) {
    const char *tag = open + 1;
    const char *close = (const char *)memchr(tag, '}', len - (size_t)(tag - name));
    if (close != NULL && close > tag) return (int)(crc16(tag, (size_t)(close - tag)) & (RL_SLOTS - 1));
  }
  return (int)(crc16(name, len) & (RL_SLOTS - 1));
}

int rl_lock_slot(const char *key, size_t len) {
  /* The prefix has no braces, so the tag starts with key and ends at its
     first '}', or at the one after it; key does not start with '}'. */
  const char *close = (const char *)memchr(key, '}', len);
  return (int)(crc16(key, close != NULL ? (size_t)(close - key) : len) & (RL_SLOTS - 1));
}

/* Reads a decimal number of at most 5 digits at *p (before end); -1 if none. */
static int read_small(const char **p, const char *end) {
  int n = 0, digits = 0;
  while (*p < end && **p >= '0' && **p <= '9' && digits < 6) {
    n = n * 10 + (**p - '0');
    (*p)++;
    digits++;
  }
  return digits == 0 || digits > 5 ? -1 : n;
}

rl_redirect_kind rl_parse_redirect(const char *msg, size_t len, rl_redirect *out) {
  const char *p = msg, *end = msg + len, *addr, *colon = NULL;
  rl_redirect_kind kind;
  if (len > 6 && memcmp(msg, "MOVED ", 6) == 0) {
    kind = RL_MOVED;
    p += 6;
  } else if (len > 4 && memcmp(msg, "ASK ", 4) == 0) {
    kind = RL_ASK;
    p += 4;
  } else {
    return RL_NO_REDIRECT;
  }
  out->slot = read_small(&p, end);
  if (out->slot < 0 || out->slot >= RL_SLOTS || p >= end || *p != ' ') return RL_NO_REDIRECT;
  addr = ++p;
  while (p < end && *p != ' ' && *p != '\r' && *p != '\n') {
    if (*p == ':') colon = p;
    p++;
  }
  if (colon == NULL || p != end) return RL_NO_REDIRECT;
  end = p;
  p = colon + 1;
  out->port = read_small(&p, end);
  if (out->port < 1 || out->port > 65535 || p != end) return RL_NO_REDIRECT;
  out->host = addr;
  out->hlen = (size_t)(colon - addr);
  out->kind = kind;
  return kind;
}

const char *rl_check_key(const char *key, size_t len) {
  (void)key;
  if (len == 0) return "key must not be empty";
  /* "<prefix>{}..." would make an empty hash tag: Redis Cluster would then hash
     the whole names and put the lock and its fence counter on different slots. */
  if (key[0] == '}') return "key must not start with '}'";
  return NULL;
}

const char *rl_check_prefix(const char *prefix, size_t len) {
  /* A brace in the prefix would decide the hash tag instead of the key's
     braces: "x{}" empties it, "{app}" puts every lock on one slot. */
  if (memchr(prefix, '{', len) != NULL || memchr(prefix, '}', len) != NULL)
    return "must not contain '{' or '}'";
  return NULL;
}

const char *rl_seconds_to_ms(double seconds, long long *ms) {
  double scaled;
  if (seconds != seconds) return "must be a number, not NaN";
  if (seconds - seconds != 0) return "must be finite";
  if (seconds <= 0) return "must be > 0";
  scaled = seconds * 1000.0 + 0.5;
  if (scaled > (double)RL_MAX_MS) return "must be at most 9007199254740.992 (2^53 ms, about 285,000 years)";
  if (scaled < 1.0) return "must be at least 0.001 (1 ms)";
  *ms = (long long)scaled;
  return NULL;
}

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
 * OS randomness is read RANDOM_BATCH bytes at a time (one syscall for 16
 * tokens). The batch is never used twice, nor by a forked child, which would
 * otherwise hand out its parent's next tokens.
 */
#define RANDOM_BATCH (16 * RL_TOKEN_BYTES)
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
