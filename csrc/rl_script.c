/* SPDX-License-Identifier: MIT */
/* The scripts the core sends, and its ops, one row each: name, script,
   keys and flags (rl_ops.h). */
#include "rl_ops.h"
#include "rl_sha1.h"

#include <pthread.h>
#include <string.h>

/*
 * The scripts. Keys and tokens arrive only as KEYS/ARGV, never in the text.
 * Each replies {status, value} with status 1 (ours), 0 (no key), -1 (another
 * owner's, or other waiters are ahead in a fair queue); acquire and release,
 * run on every cycle, reply one integer for the two (see rl_result: an
 * array reply costs Redis about half a microsecond more). The keys share the
 * lock's hash tag, so Redis Cluster runs each script on one node:
 *   <prefix>{<key>}          the lock: its value is the owner's token
 *   <prefix>{<key>}:fence    the fencing counter (never expires)
 *   <prefix>{<key>}:signal   wake-one list waiters block on (BLPOP); a
 *                            registered waiter blocks on <...>:signal:<its token>
 *   <prefix>{<key>}:queue    fair waiters by arrival (score: server time, us)
 *   <prefix>{<key>}:hand     each fair waiter's registration: "<the ms
 *                            (server time) by which it must be back> <the
 *                            TTL to hand it>"; one that stops coming back
 *                            by then leaves the queue
 *   <prefix>{<key>}:waiters  the waiters mark: set by every acquire that
 *                            fails and registers nothing, for the holder's
 *                            TTL and a second (for a fair waiter: as long
 *                            as it stays queued)
 *   <prefix>{<key>}:handoff  the waiters registered in mode "notify": members
 *                            "<the TTL to hand it> <token>", scored by the
 *                            ms (server time) their registration lapses
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
 * Waking: release (and a registered waiter that gives up while the lock is
 * free) hands the lock over, or pushes one element onto one signal list,
 * when the waiters mark or the handoff set says that somebody may wait
 * (with nobody waiting, a release is GET, DEL and one EXISTS of both), so
 * exactly one blocked waiter wakes: the first live one of the fair queue if
 * there is one, else a live notify waiter (see "Handing over"), else
 * whoever blocks on the shared list. The list expires
 * after RL_SIGNAL_MS, so a waiter that was between its attempt and its BLPOP
 * still finds it, and nothing is left behind. The mark is safe to miss only
 * after a waiter's BLPOP ended: a waiter never blocks past the holder's TTL
 * it was told (wait.lua), and one that tries again and fails sets the mark
 * again. The signal key of a fair waiter is built in the script (from
 * KEYS[2] and the queue's token); it has the same hash tag.
 *
 * Handing over. A waiter that will block registers for a handoff on each try
 * that finds the lock held: in mode "notify" (acquire_wait) as one member
 * "<ttl> <token>" of <prefix>{<key>}:handoff, scored by when the
 * registration lapses (two calls: ZADD, PEXPIRE); a fair waiter
 * (acquire_fair) in the queue (by arrival), and in <...>:hand with the time
 * it must be back by and the TTL to hand it. Then it blocks on its own list
 * <...>:signal:<token>. A release that finds a live fair waiter at the
 * queue's head, or else pops a live notify registration (the one renewed
 * longest ago: one ZPOPMIN, which also takes it out; waiters renew once a
 * second, so that is about the order they came in, not exactly), gives it
 * the lock in the same script: the key takes its token with its TTL, the
 * fence grows, and its list gets "<fence> <age> <at>" (age: ms since it
 * registered, for its clock; at: the server's ms then). Its BLPOP is served
 * as the script ends, and it returns holding the lock: no second round trip.
 * A waiter may not be there to take it: its process died, or it gave up as
 * the release came. It cannot block on its list any more, so the element
 * stays; a try by another that finds the lock held by a token whose list
 * still holds a handoff older than RL_CLAIM_MS takes that handoff back
 * (deletes the lock and the element, in one step: the late waiter, if any,
 * then finds nothing and tries again). A waiter that gives up (leave) passes
 * on a lock handed to it meanwhile; one whose block ended as the lock came
 * finds its own token on its next try, which takes it and drops the element.
 * Nothing tells a paused waiter from a live one (Redis serves its BLPOP all
 * the same): it holds the lock for the TTL it registered, as a holder paused
 * in its section does (docs/guarantees.md); a waiter that renews registers a
 * short one, which its renewal extends at once (wait.lua). A read-write
 * lock's writers are handed its writer key the same way (write_acquire_wait
 * registers; write_release and the last reader's read_release hand over;
 * stale() takes back in every try, a reader's too), with queue and hand of
 * their own (<...>:rw:queue, :rw:hand).
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
 * the master's clock (TIME) in milliseconds, RL_ERA_LEAD ahead of it for a
 * promoted replica (master_replid2 set), or the record's offset plus
 * RL_ERA_STEP when that is larger (a clock behind). The clock, not the old
 * offset plus a constant: two masters that start their eras from the same
 * record (a master restarted, its replicas not yet copying its new era,
 * then one of them promoted; make torture found it) must not share an
 * offset, and they start at different times. The lead: a master killed
 * and restarted at once comes back as a master, and the sentinels may
 * still send clients to it while they promote one of its replicas (make
 * torture found it: the restarted master's era began 250 ms after the
 * promoted replica's, whose fences then ran below the ones the deposed
 * master had handed out, and later equal to them); the promoted replica,
 * the one that stays, starts its era 5 s ahead, above a restart's that
 * comes within the time the sentinels take to name it (about a second).
 * Not more: a failover that is undone (the old master named again, never
 * demoted, its ID and era unchanged) leaves the old master's fences
 * below the ones the replica handed out meanwhile, by the time between
 * the two eras' starts and the lead (docs/guarantees.md). Every fence of the
 * new master is above every fence of the old one as long as the old one
 * granted fewer locks on one key that the new one never saw than there
 * were milliseconds between the two eras' starts (for a promoted
 * replica, plus the lead).
 * A record missing on a
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
 * master wrote (docs/guarantees.md).
 */

/* With `now` set (NOW): finds the queue's first live waiter, heir (nil when
   none), with hms, the TTL to hand it, and since, when it registered (ms,
   server time); waiters found dead on the way (past their deadline, or
   with no registration: left by an eviction or a partial delete) leave the
   queue. A registration is "<deadline> <ttl>", its deadline RL_FAIR_STAY_MS
   after it was made. */
#define FIRST_LIVE(queue, hand)                                            \
  "local heir, hms, since, popped\n"                                       \
  "while true do\n"                                                        \
  "  heir = redis.call('ZRANGE', " queue ", 0, 0)[1]\n"                    \
  "  if not heir then break end\n"                                         \
  "  local r = redis.call('HGET', " hand ", heir)\n"                       \
  "  local due, ttl = string.match(r or '', '^(%d+) (%d+)$')\n"            \
  "  if due and tonumber(due) > now then\n"                                \
  "    hms, since = ttl, tonumber(due) - " RL_STR(RL_FAIR_STAY_MS) "\n"      \
  "    break\n"                                                            \
  "  end\n"                                                                \
  "  redis.call('ZREM', " queue ", heir)\n"                                \
  "  if r then redis.call('HDEL', " hand ", heir) end\n"                   \
  "end\n"

/* A notify waiter's member of the handoff set: "<ttl> <token>", ARGV[1]
   the token (FIRST_READY reads it back). */
#define READY_MEMBER(ttl) ttl " .. ' ' .. ARGV[1]"

/* After FIRST_LIVE found no heir, with `now` set: pops the lock's
   registered waiters (wait_mode "notify": its handoff set, members
   "<ttl> <token>" scored by when their registration lapses) until a live
   one, the one renewed longest ago: heir, hms, since; popped (its
   registration is gone already, and with it should the handoff then fail:
   the waiter registers again within a second). Lapsed ones are dropped on
   the way. */
#define FIRST_READY(handoff)                                               \
  "while not heir do\n"                                                    \
  "  local e = redis.call('ZPOPMIN', " handoff ")\n"                       \
  "  if not e[1] then break end\n"                                         \
  "  if tonumber(e[2]) > now then\n"                                       \
  "    hms, heir = string.match(e[1], '^(%d+) (.+)$')\n"                   \
  "    since, popped = tonumber(e[2]) - " RL_STR(RL_FAIR_STAY_MS) ", true\n" \
  "  end\n"                                                                \
  "end\n"

/* Defines list(command, name, ...): the command on a waiter's own wake-up
   list, whose name has the waiter's token and so is not in KEYS (it has
   the lock's hash tag: its slot is the lock's). While a cluster slot
   moves, Redis refuses a name that is not on this node ("non local key")
   inside a script; list answers nil, true then, else the command's reply. */
#define LIST_FN                                                            \
  "local function list(...)\n"                                             \
  "  local r = redis.pcall(...)\n"                                         \
  "  if type(r) == 'table' and r.err then return nil, true end\n"          \
  "  return r\n"                                                           \
  "end\n"

/* Wakes one waiter with "1" (it tries again): heir's own list, or the
   shared one when heir is nil. Needs list() (LIST_FN). */
#define WAKE_ONE(signal)                                                   \
  "local sig = heir and (" signal " .. ':' .. heir) or " signal "\n"       \
  "list('DEL', sig)\n"                                                     \
  "list('RPUSH', sig, 1)\n"                                                \
  "list('PEXPIRE', sig, " RL_STR(RL_SIGNAL_MS) ")\n"

/* After FIRST_LIVE or FIRST_READY found heir, with the lock free: hands it
   the lock (see "Handing over") and sets handed. Needs era() (ERA_FN) and
   list() (LIST_FN). The wake-up is pushed first, as a list out of KEYS may be
   refused (then nothing is handed over); the lock is written next, and
   should that fail (no memory), the wake-up goes, so that nobody takes it
   for the lock. No DEL before the RPUSH: a plain wake-up left in the list
   ("1") only makes the waiter try once more, which finds its own token. */
#define HAND_TO_HEIR(lock, signal, queue, hand, fence, rec)                \
  "local f = redis.call('INCR', " fence ") + era(" rec ")\n"                \
  "local sig = " signal " .. ':' .. heir\n"                                 \
  "local _, refused = list('RPUSH', sig, " FMT "f) .. ' ' .. " FMT "math.max(now - since, 0)) .. ' ' .. " FMT "now))\n" \
  "if not refused then\n"                                                  \
  "  list('PEXPIRE', sig, hms)\n"                                          \
  "  if redis.pcall('SET', " lock ", heir, 'PX', hms).err then\n"           \
  "    list('DEL', sig)\n"                                                 \
  "  else\n"                                                               \
  "    handed = true\n"                                                    \
  "    if not popped then\n"                                               \
  "      redis.call('ZREM', " queue ", heir)\n"                             \
  "      redis.call('HDEL', " hand ", heir)\n"                              \
  "    end\n"                                                              \
  "  end\n"                                                                \
  "end\n"

/* With the lock free and `now` set: hands it to the first live registered
   waiter, a fair one first (queue), then one waiting in mode "notify"
   (handoff), or wakes one waiter of the shared list (those that did not
   register: a multi-key lock's, or an older version's). */
#define HAND_NEXT(lock, signal, queue, hand, fence, rec, handoff)          \
  FIRST_LIVE(queue, hand)                                                  \
  FIRST_READY(handoff)                                                     \
  "if heir then\n"                                                         \
  HAND_TO_HEIR(lock, signal, queue, hand, fence, rec)                      \
  "else\n"                                                                 \
  WAKE_ONE(signal)                                                         \
  "end\n"

/* Registers waiter ARGV[1], waiting in mode "notify", for a handoff of
   ARGV[3] ms (see "Handing over"), with `now` set: member ("<ttl>
   <token>") of the handoff set, scored by when its registration lapses,
   ARGV[4] ms from now (a waiter comes back within a second), and the set
   kept as long. Its own list is emptied, as REGISTER's. */
#define REGISTER_READY(lock, handoff)                                      \
  "list('DEL', " lock " .. ':signal:' .. ARGV[1])\n"                       \
  "redis.call('ZADD', " handoff ", " FMT "now + tonumber(ARGV[4])), member)\n" \
  "redis.call('PEXPIRE', " handoff ", ARGV[4])\n"

/* Registers waiter ARGV[1] for a handoff of hms ms (an ARGV: see "Handing
   over"): in the queue by arrival (kept when it is there already), and
   its registration, which lasts ARGV[4] ms; and the waiters mark for as
   long as the lock may stay as it is (left ms) or the registration lasts,
   and a second. Its own list is emptied: the try found the lock not its
   own, so a handoff left there is of a lock it no longer holds (taken
   back, force-released, evicted), and must not be taken for one. */
#define REGISTER(lock, queue, hand, waiters, hms)                          \
  REGISTER_IN(lock " .. ':signal'", queue, hand, hms)                      \
  "redis.call('SET', " waiters ", 1, 'PX', math.max(left, tonumber(ARGV[4])) + " RL_STR(RL_WAITERS_SLACK_MS) ")\n"
/* The registration alone, the waiter's list being "<signal>:<token>" (a
   read-write lock's writers, which need no waiters mark: the releases
   look at the queue itself). */
#define REGISTER_IN(signal, queue, hand, hms)                              \
  "list('DEL', " signal " .. ':' .. ARGV[1])\n"                             \
  "redis.call('ZADD', " queue ", 'NX', t[1] .. string.format('%06d', t[2]), ARGV[1])\n" \
  "redis.call('HSET', " hand ", ARGV[1], " FMT "now + tonumber(ARGV[4])) .. ' ' .. " hms ")\n" \
  "redis.call('PEXPIRE', " queue ", ARGV[4])\n"                             \
  "redis.call('PEXPIRE', " hand ", ARGV[4])\n"

/* Defines stale(v): whether the lock (the key lock, whose waiters' lists
   are "<signal>:<token>"), held by token v, was handed to a waiter that
   has not taken up its wake-up (the last element of its list: a plain
   wake-up may be before it): nil when not (or not a handoff); the ms
   until it may be taken back (RL_CLAIM_MS after the handoff); or 0 when
   it was older and has just been taken back (the lock and the element
   deleted: the lock is free). Needs list() (LIST_FN). STALE_FN is the
   lock's (KEYS[1]); a read-write lock's writer key uses STALE_FN_OF. */
#define STALE_FN STALE_FN_OF("KEYS[1]", "KEYS[1] .. ':signal'")
#define STALE_FN_OF(lock, signal)                                          \
  "local function stale(v)\n"                                              \
  "  local sig = " signal " .. ':' .. v\n"                                 \
  "  local e = list('LINDEX', sig, -1)\n"                                    \
  "  local at = e and tonumber(string.match(e, ' (%d+)$'))\n"               \
  "  if not at then return nil end\n"                                      \
  "  local t = redis.call('TIME')\n"                                       \
  "  local age = t[1] * 1000 + math.floor(t[2] / 1000) - at\n"             \
  "  if age < " RL_STR(RL_CLAIM_MS) " then return " RL_STR(RL_CLAIM_MS) " - age end\n" \
  "  if select(2, list('DEL', sig)) then return nil end\n"                \
  "  redis.call('DEL', " lock ")\n"                                         \
  "  return 0\n"                                                           \
  "end\n"

/* Leaves `now` (ms, server time) and `t` (TIME's reply). */
#define NOW                                                                \
  "local t = redis.call('TIME')\n"                                         \
  "local now = t[1] * 1000 + math.floor(t[2] / 1000)\n"

/* A whole number as Redis wants it (Lua 5.1 would write 1e+15). */
#define FMT "string.format('%.0f', "

/* Defines era(rec): the fence offset of this master's era in the slot whose
   era record is rec (see "Fences across failovers"), starting a new era
   there when the record names another master; it leaves era_id, this
   master's ID. INFO is read once a script, and not at all when the record
   names era_trust (set by a script whose connection vouches for that ID as
   this master's, as a take's does). */
#define ERA_FN                                                             \
  "local era_info, era_id, era_trust\n"                                    \
  "local function era(rec)\n"                                              \
  "  local r = redis.call('GET', rec)\n"                                   \
  "  local off = r and tonumber(string.match(r, ' (%d+)$')) or 0\n"        \
  "  if era_trust and r and string.sub(r, 1, #era_trust + 1) == era_trust .. ' ' then return off end\n" \
  "  era_info = era_info or redis.call('INFO', 'replication')\n"           \
  "  local id = string.match(era_info, 'master_replid:(%x+)')\n"           \
  "  if not id then error('redislock: INFO replication names no master_replid') end\n" \
  "  era_id = id\n"                                                        \
  "  if r and string.sub(r, 1, #id + 1) == id .. ' ' then return off end\n" \
  "  local promoted = not string.find(era_info, 'master_replid2:' .. string.rep('0', 40), 1, true)\n" \
  "  if r or promoted then\n"                                              \
  "    local t = redis.call('TIME')\n"                                       \
  "    local lead = promoted and " RL_STR(RL_ERA_LEAD) " or 0\n"             \
  "    off = math.max(off + " RL_STR(RL_ERA_STEP) ", t[1] * 1000 + math.floor(t[2] / 1000) + lead)\n" \
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

/* A writer's try that did not take the write lock: left, the ms until it
   may change (the writer's PTTL, a stale handoff's claim time when
   sooner, or the last reader's expiry). Needs v and s (stale's answer). */
#define RW_LEFT                                                            \
  "local left\n"                                                           \
  "if v then\n"                                                            \
  "  left = redis.call('PTTL', KEYS[2])\n"                                 \
  "  if s and s > 0 and s < left then left = s end\n"                      \
  "else\n"                                                                 \
  "  left = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2]) - now\n" \
  "end\n"

/* With no reader in, and the writer key free or the releasing writer's,
   and `now` and `handed` set: hands the write lock to the first live
   registered writer (as HAND_TO_HEIR hands a lock: the key takes its
   token; the heir leaves the waiting writers), else wakes every waiter. */
#define RW_HAND_OR_WAKE(writer, signal, waiters, queue, hand, fence, rec, writers) \
  FIRST_LIVE(queue, hand)                                                  \
  "if heir then\n"                                                         \
  HAND_TO_HEIR(writer, signal, queue, hand, fence, rec)                    \
  "  if handed then redis.call('ZREM', " writers ", heir) end\n"          \
  "end\n"                                                                  \
  "if not handed then\n"                                                   \
  WAKE_ALL(signal, waiters)                                                \
  "end\n"

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

/* acquire: KEYS lock, fence, waiters, era; ARGV[1] token, ARGV[2]
   ttl (ms), and after a take that could not tell the fence, ARGV[3] the
   master ID its era record names, which the connection trusts from then
   on when it is this master's (rl_cmd_claim). Replies one integer: the
   fence, or -2 - the holder's PTTL; or {2, the fence} when the lock is
   ours but this master's ID is not ARGV[3] (an earlier master wrote the
   record: not to be trusted). A lock handed to a waiter that never took
   it up is taken back (stale, see "Handing over"). */
static const char acquire_script[] =
  ERA_FN
  LIST_FN
  STALE_FN
  "local function ours(fence)\n"
  "  if ARGV[3] and ARGV[3] ~= era_id then return {2, fence} end\n"
  "  return fence\n"
  "end\n"
  "local function take()\n"
  "  return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])\n"
  "end\n"
  "if take() then\n"
  "  return ours(redis.call('INCR', KEYS[2]) + era(KEYS[4]))\n"
  "end\n"
  "local v = redis.call('GET', KEYS[1])\n"
  "if v == ARGV[1] then\n"
  "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
  "  list('DEL', KEYS[1] .. ':signal:' .. ARGV[1])\n"
  "  local fence = tonumber(redis.call('GET', KEYS[2]))\n"
  "  if fence and fence >= 1 then return ours(fence + era(KEYS[4])) end\n"
  "  return ours(redis.call('INCR', KEYS[2]) + era(KEYS[4]))\n"
  "end\n"
  "local left = redis.call('PTTL', KEYS[1])\n"
  "local s = v and stale(v)\n"
  "if s == 0 and take() then return ours(redis.call('INCR', KEYS[2]) + era(KEYS[4])) end\n"
  "if s and s > 0 and s < left then left = s end\n"
  "redis.call('SET', KEYS[3], 1, 'PX', math.max(left, 0) + " RL_STR(RL_WAITERS_SLACK_MS) ")\n"
  "return -2 - left\n";

/* acquire_wait: KEYS lock, fence, handoff, era; ARGV[1] token, ARGV[2]
   ttl (ms), ARGV[3] the TTL a handoff gives it (ms: the ttl, or less for a
   waiter whose renewal extends it at once), ARGV[4] how long its
   registration lasts (ms).
   A waiter's try (mode "notify"): acquire's, which registers the waiter
   for a handoff when the lock is held (REGISTER_READY, see "Handing
   over"), and drops its registration when it takes the lock. Replies as
   acquire. The first step takes the lock or reads its holder: SET NX GET
   (Redis 7), or SET NX then GET where that is refused (Redis 6: one call
   more, and a refused one in INFO errorstats). */
static const char acquire_wait_script[] =
  ERA_FN
  LIST_FN
  STALE_FN
  "local member = " READY_MEMBER("ARGV[3]") "\n"
  "local function taken(fence)\n"
  "  redis.call('ZREM', KEYS[3], member)\n"
  "  return fence + era(KEYS[4])\n"
  "end\n"
  "local function take()\n"
  "  return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])\n"
  "end\n"
  "local v = redis.pcall('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')\n"
  "if type(v) == 'table' and v.err then v = not take() and redis.call('GET', KEYS[1]) end\n"
  "if not v then return taken(redis.call('INCR', KEYS[2])) end\n"
  "if v == ARGV[1] then\n"
  "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
  "  list('DEL', KEYS[1] .. ':signal:' .. ARGV[1])\n"
  "  local fence = tonumber(redis.call('GET', KEYS[2]))\n"
  "  if fence and fence >= 1 then return taken(fence) end\n"
  "  return taken(redis.call('INCR', KEYS[2]))\n"
  "end\n"
  "local left = redis.call('PTTL', KEYS[1])\n"
  "local s = stale(v)\n"
  "if s == 0 and take() then return taken(redis.call('INCR', KEYS[2])) end\n"
  "if s and s > 0 and s < left then left = s end\n"
  NOW
  REGISTER_READY("KEYS[1]", "KEYS[3]")
  "return -2 - left\n";

/* release: KEYS lock, signal, queue, hand, waiters, fence, era, handoff;
   ARGV[1] token, and ARGV[2], when the connection vouches for this master's ID
   (see "Fences across failovers"), that ID: a handoff then trusts an era
   record that names it without reading INFO. The handoff or wake-up runs
   only when the waiters mark or the handoff set is there, and under pcall: a failure there (a
   key of the wrong type, no memory) must not turn the release into an
   error, as Redis does not undo what ran before it; the lock is deleted
   after it unless it was handed over. Replies one integer: 1, 0 (no
   lock), or -2 - the PTTL of another owner's. */
static const char release_script[] =
  ERA_FN
  LIST_FN
  "local v = redis.call('GET', KEYS[1])\n"
  "if v == ARGV[1] then\n"
  "  local handed = false\n"
  "  era_trust = ARGV[2]\n"
  "  if redis.call('EXISTS', KEYS[5], KEYS[8]) > 0 then pcall(function()\n"
  NOW
  HAND_NEXT("KEYS[1]", "KEYS[2]", "KEYS[3]", "KEYS[4]", "KEYS[6]", "KEYS[7]", "KEYS[8]")
  "  end) end\n"
  "  if not handed then redis.call('DEL', KEYS[1]) end\n"
  "  return 1\n"
  "end\n"
  "if v then return -2 - redis.call('PTTL', KEYS[1]) end\n"
  "return 0\n";

/* extend: KEYS lock; ARGV[1] token, ARGV[2] ttl (ms) */
static const char extend_script[] = KEY_EXTEND;

/* pttl: KEYS lock; ARGV[1] token */
static const char pttl_script[] = KEY_PTTL;

/* acquire_fair: KEYS lock, fence, queue, hand, waiters, era; ARGV[1] token,
   ARGV[2] ttl (ms), ARGV[3] the TTL a handoff gives it (ms, as
   acquire_wait's), ARGV[4] how long a waiter stays queued without coming
   back (ms). Takes the lock only when it is free and no live waiter came
   first (when one did, and the lock is free, it is handed to that one);
   else queues the token (keeping its first arrival), registered for a
   handoff (see "Handing over"), and answers {-1, PTTL of the holder, or -2
   when the lock is free}. */
static const char acquire_fair_script[] =
  ERA_FN
  LIST_FN
  STALE_FN
  NOW
  "local v = redis.call('GET', KEYS[1])\n"
  "if v == ARGV[1] then\n"
  "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
  "  list('DEL', KEYS[1] .. ':signal:' .. ARGV[1])\n"
  "  redis.call('ZREM', KEYS[3], ARGV[1])\n"
  "  redis.call('HDEL', KEYS[4], ARGV[1])\n"
  "  local fence = redis.call('GET', KEYS[2])\n"
  "  if fence then return {1, tonumber(fence) + era(KEYS[6])} end\n"
  "  return {1, redis.call('INCR', KEYS[2]) + era(KEYS[6])}\n"
  "end\n"
  "local s = v and stale(v)\n"
  "if s == 0 then v = false end\n"
  "if not v then\n"
  FIRST_LIVE("KEYS[3]", "KEYS[4]")
  "  if heir == nil or heir == ARGV[1] then\n"
  "    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\n"
  "    redis.call('ZREM', KEYS[3], ARGV[1])\n"
  "    redis.call('HDEL', KEYS[4], ARGV[1])\n"
  "    return {1, redis.call('INCR', KEYS[2]) + era(KEYS[6])}\n"
  "  end\n"
  "  local handed\n"
  "  local signal = KEYS[1] .. ':signal'\n"
  HAND_TO_HEIR("KEYS[1]", "signal", "KEYS[3]", "KEYS[4]", "KEYS[2]", "KEYS[6]")
  "  v = heir\n"
  "end\n"
  "local left = redis.call('PTTL', KEYS[1])\n"
  "if s and s > 0 and s < left then left = s end\n"
  REGISTER("KEYS[1]", "KEYS[3]", "KEYS[4]", "KEYS[5]", "ARGV[3]")
  "return {-1, left}\n";

/* leave: KEYS lock, signal, queue, hand, fence, era, handoff; ARGV[1]
   token, ARGV[2] the TTL it registered to be handed (a waiter in mode
   "notify": see REGISTER_READY). A registered waiter gives up: it leaves
   the queue or the handoff set; a lock handed to it
   meanwhile is passed on; and if the lock is free the next waiter is
   handed it or woken (it would otherwise wait for its own timeout). */
static const char leave_script[] =
  ERA_FN
  LIST_FN
  "redis.call('ZREM', KEYS[3], ARGV[1])\n"
  "redis.call('HDEL', KEYS[4], ARGV[1])\n"
  "redis.call('ZREM', KEYS[7], " READY_MEMBER("ARGV[2]") ")\n"
  "local v = redis.call('GET', KEYS[1])\n"
  "if v == ARGV[1] then\n"
  "  redis.call('DEL', KEYS[1])\n"
  "  list('DEL', KEYS[2] .. ':' .. ARGV[1])\n"
  "  v = false\n"
  "end\n"
  "if not v then\n"
  "  local handed\n"
  NOW
  HAND_NEXT("KEYS[1]", "KEYS[2]", "KEYS[3]", "KEYS[4]", "KEYS[5]", "KEYS[6]", "KEYS[7]")
  "end\n"
  "return {0, 0}\n";

/* release_one: KEYS lock; ARGV[1] token. Release without the
   wake-up, whose keys may be missing on a node while the slot moves
   (Redis answers TRYAGAIN to a script with some of its keys missing
   then); waiters find the lock free by the bound of their wait. Replies
   as release. */
static const char release_one_script[] =
  "local v = redis.call('GET', KEYS[1])\n"
  "if v == ARGV[1] then\n"
  "  redis.call('DEL', KEYS[1])\n"
  "  return 1\n"
  "end\n"
  "if v then return -2 - redis.call('PTTL', KEYS[1]) end\n"
  "return 0\n";

/* read_release_one, sem_release_one: KEYS readers (permits); ARGV[1]
   token. A read hold's or a permit's release as release_one is a lock's:
   its own key alone, waking nobody (a cluster slot half moved). Replies
   as read_release. */
static const char zset_release_one_script[] =
  NOW
  "local s = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
  "if not s then return 0 end\n"
  "redis.call('ZREM', KEYS[1], ARGV[1])\n"
  "if tonumber(s) <= now then return 0 end\n"
  "return 1\n";

/* fence_up: KEYS lock, fence, era; ARGV[1] token, ARGV[2] a fence.
   Only while the lock holds our token (a holder whose lock expired must
   not push a stale fence past a newer holder's), the counter is raised
   so that this server's fence (counter + its era's offset) is at least
   ARGV[2]. Replies as release: 1 (ours, done), 0, or -2 - PTTL. */
static const char fence_up_script[] =
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
  "return 0\n";

/* With `now` set: drops the semaphore's expired permits, and takes back
   those handed to a waiter (KEYS[1] the permits, handed: permits handed
   over by when, ms) that did not take up its wake-up within RL_CLAIM_MS
   (see "Handing over"; a permit's wake-up list is
   <prefix>{<name>}:permits:signal:<token>). */
#define SEM_RECLAIM(handed)                                                \
  "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"                 \
  "for _, h in ipairs(redis.call('ZRANGEBYSCORE', " handed ", '-inf', now - " RL_STR(RL_CLAIM_MS) ")) do\n" \
  "  local sig = KEYS[1] .. ':signal:' .. h\n"                              \
  "  local n = list('LLEN', sig)\n"                                          \
  "  if n and n > 0 and not select(2, list('DEL', sig)) then redis.call('ZREM', KEYS[1], h) end\n" \
  "  redis.call('ZREM', " handed ", h)\n"                                   \
  "end\n"

/* In a semaphore's take that found the permit its own (resent): the fence
   of a handoff whose wake-up it did not wait for, which is its fence (the
   counter may have grown since, for other holders), or nil; its wake-up
   list is emptied either way. */
#define SEM_HANDED_FENCE                                                   \
  "  local handed_fence\n"                                                 \
  "  if resent then\n"                                                     \
  "    local own = KEYS[1] .. ':signal:' .. ARGV[1]\n"                      \
  "    local e = list('LINDEX', own, -1)\n"                                 \
  "    handed_fence = e and tonumber(string.match(e, '^(%d+) '))\n"         \
  "    list('DEL', own)\n"                                                 \
  "  end\n"

/* With `now` set and a permit free: hands it to the first live registered
   waiter of the semaphore (its own expiry, the fence that grows, the
   wake-up, as HAND_TO_HEIR does for a lock; noted in handed), or wakes
   one waiter of the shared list. Needs era() (ERA_FN). */
#define SEM_HAND_NEXT(signal, queue, hand, fence, rec, handed)             \
  FIRST_LIVE(queue, hand)                                                  \
  "local given = false\n"                                                  \
  "if heir then\n"                                                         \
  "  local f = redis.call('INCR', " fence ") + era(" rec ")\n"              \
  "  local sig = " signal " .. ':' .. heir\n"                               \
  "  local _, refused = list('RPUSH', sig, " FMT "f) .. ' ' .. " FMT "math.max(now - since, 0)) .. ' ' .. " FMT "now))\n" \
  "  if not refused then\n"                                                \
  "    list('PEXPIRE', sig, hms)\n"                                        \
  "    local r = redis.pcall('ZADD', KEYS[1], " FMT "now + tonumber(hms)), heir)\n" \
  "    if type(r) == 'table' and r.err then\n"                               \
  "      list('DEL', sig)\n"                                               \
  "    else\n"                                                             \
  "      given = true\n"                                                   \
  ZSET_EXPIRE("KEYS[1]")                                                   \
  "      redis.call('ZREM', " queue ", heir)\n"                             \
  "      redis.call('HDEL', " hand ", heir)\n"                              \
  "      redis.call('ZADD', " handed ", now, heir)\n"                       \
  "      if redis.call('PTTL', " handed ") < tonumber(hms) then redis.call('PEXPIRE', " handed ", hms) end\n" \
  "    end\n"                                                              \
  "  end\n"                                                                \
  "end\n"                                                                  \
  "if not given then\n"                                                    \
  "  heir = nil\n"                                                         \
  WAKE_ONE(signal)                                                         \
  "end\n"

/* sem_acquire: KEYS permits, fence, waiters, era, handed; ARGV[1] token,
   ARGV[2] ttl (ms), ARGV[3] the limit. Expired permits are dropped first
   (by the server's clock), and permits handed to waiters gone are taken
   back; a token already holding a permit (a resend, or a permit handed to
   it whose wake-up it did not wait for) keeps it. Replies as acquire: the
   fence, or -2 - the ms until a permit may be free (the first one
   expires, or one handed over lately may be taken back), and sets the
   waiters mark. */
static const char sem_acquire_script[] =
  ERA_FN
  LIST_FN
  NOW
  SEM_RECLAIM("KEYS[5]")
  "local resent = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
  "if resent or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then\n"
  "  redis.call('ZADD', KEYS[1], " FMT "now + tonumber(ARGV[2])), ARGV[1])\n"
  ZSET_EXPIRE("KEYS[1]")
  SEM_HANDED_FENCE
  "  if handed_fence then return handed_fence end\n"
  FENCE_OF("KEYS[2]", "KEYS[4]", "resent")
  "end\n"
  "local left = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]) - now\n"
  "local oldest = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')[2]\n"
  "if oldest then left = math.min(left, math.max(tonumber(oldest) + " RL_STR(RL_CLAIM_MS) " - now, 1)) end\n"
  "redis.call('SET', KEYS[3], 1, 'PX', " FMT "math.max(left, 0) + " RL_STR(RL_WAITERS_SLACK_MS) "))\n"
  "return -2 - left\n";

/* sem_acquire_wait: KEYS permits, fence, queue, hand, waiters, era, handed;
   ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] the limit, ARGV[4] how long its
   registration lasts (ms). A waiter's try: sem_acquire's, which registers
   the waiter for a handoff (of a permit for its ttl) when none is free,
   and drops its registration when it takes one. Replies as acquire. */
static const char sem_acquire_wait_script[] =
  ERA_FN
  LIST_FN
  NOW
  SEM_RECLAIM("KEYS[7]")
  "local resent = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
  "if resent or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then\n"
  "  redis.call('ZADD', KEYS[1], " FMT "now + tonumber(ARGV[2])), ARGV[1])\n"
  ZSET_EXPIRE("KEYS[1]")
  SEM_HANDED_FENCE
  "  redis.call('ZREM', KEYS[3], ARGV[1])\n"
  "  redis.call('HDEL', KEYS[4], ARGV[1])\n"
  "  if handed_fence then return handed_fence end\n"
  FENCE_OF("KEYS[2]", "KEYS[6]", "resent")
  "end\n"
  "local left = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]) - now\n"
  REGISTER("KEYS[1]", "KEYS[3]", "KEYS[4]", "KEYS[5]", "ARGV[2]")
  "return -2 - left\n";

/* sem_release: KEYS permits, signal, waiters, queue, hand, fence, era,
   handed; ARGV[1] token. When the mark says somebody may wait, the permit
   goes to the first live registered waiter, else one waiter is woken.
   Replies 1, or 0 when the permit is gone (expired, or taken back). */
static const char sem_release_script[] =
  ERA_FN
  LIST_FN
  NOW
  "local s = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
  "if not s then return 0 end\n"
  "redis.call('ZREM', KEYS[1], ARGV[1])\n"
  "if tonumber(s) <= now then return 0 end\n"
  "if redis.call('EXISTS', KEYS[3]) == 1 then pcall(function()\n"
  SEM_HAND_NEXT("KEYS[2]", "KEYS[4]", "KEYS[5]", "KEYS[6]", "KEYS[7]", "KEYS[8]")
  "end) end\n"
  "return 1\n";

/* sem_leave: KEYS permits, signal, queue, hand, fence, era, handed;
   ARGV[1] token. A registered waiter gives up: it leaves the queue, and a
   permit its token holds (handed to it meanwhile, or taken by a try whose
   answer was lost: the client counts on neither) is passed on. */
static const char sem_leave_script[] =
  ERA_FN
  LIST_FN
  NOW
  "redis.call('ZREM', KEYS[3], ARGV[1])\n"
  "redis.call('HDEL', KEYS[4], ARGV[1])\n"
  "list('DEL', KEYS[2] .. ':' .. ARGV[1])\n"
  "redis.call('ZREM', KEYS[7], ARGV[1])\n"
  "local s = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
  "if s then\n"
  "  redis.call('ZREM', KEYS[1], ARGV[1])\n"
  "  if tonumber(s) > now then\n"
  SEM_HAND_NEXT("KEYS[2]", "KEYS[3]", "KEYS[4]", "KEYS[5]", "KEYS[6]", "KEYS[7]")
  "  end\n"
  "end\n"
  "return {0, 0}\n";

/* sem_extend: KEYS permits; ARGV[1] token, ARGV[2] ttl (ms) */
static const char sem_extend_script[] = ZSET_EXTEND;

/* sem_pttl: KEYS permits; ARGV[1] token */
static const char sem_pttl_script[] = ZSET_PTTL;

/* sem_count: KEYS permits. Replies {1, permits held now}. */
static const char sem_count_script[] =
  NOW
  "return {1, redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')}\n";

/* read_acquire: KEYS readers, writer, fence, writers, waiters, era,
   signal; ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] how long a waiting
   writer stays queued (ms). A reader gets in when no writer holds the lock
   and none waits (writers first: a stream of readers cannot starve one).
   The write lock handed to a writer that never took it up is taken back
   (stale). Replies as acquire: the fence, or -2 - ms until it may change
   (the writer's PTTL, or the last waiting writer's stay). */
static const char read_acquire_script[] =
  ERA_FN
  LIST_FN
  STALE_FN_OF("KEYS[2]", "KEYS[7]")
  NOW
  "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
  "redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)\n"
  "local resent = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
  "local wleft = redis.call('PTTL', KEYS[2])\n"
  "local s = wleft >= 0 and not resent and stale(redis.call('GET', KEYS[2]))\n"
  "if s == 0 then wleft = -2 elseif s and s < wleft then wleft = s end\n"
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
  "return -2 - left\n";

/* read_release: KEYS readers, signal, waiters, writer, queue, hand,
   fence, era, writers; ARGV[1] token. The last reader out hands the write lock to
   the first registered writer (RW_HAND_OR_WAKE), else wakes every
   waiter. Replies as sem_release. */
static const char read_release_script[] =
  ERA_FN
  LIST_FN
  NOW
  "local s = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
  "if not s then return 0 end\n"
  "redis.call('ZREM', KEYS[1], ARGV[1])\n"
  "if tonumber(s) <= now then return 0 end\n"
  "if redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') == 0\n"
  "   and redis.call('EXISTS', KEYS[3], KEYS[5]) > 0 and redis.call('EXISTS', KEYS[4]) == 0 then\n"
  "  pcall(function()\n"
  "  local handed = false\n"
  RW_HAND_OR_WAKE("KEYS[4]", "KEYS[2]", "KEYS[3]", "KEYS[5]", "KEYS[6]", "KEYS[7]", "KEYS[8]", "KEYS[9]")
  "  end)\n"
  "end\n"
  "return 1\n";

/* read_extend: KEYS readers; ARGV[1] token, ARGV[2] ttl (ms) */
static const char read_extend_script[] = ZSET_EXTEND;

/* read_pttl: KEYS readers; ARGV[1] token */
static const char read_pttl_script[] = ZSET_PTTL;

/* The head of a writer's try (write_acquire, write_acquire_wait; KEYS
   readers, writer, fence, writers; signal: the waiters' lists): readers
   and waiting writers past their deadlines dropped; v, the writer key's
   token (false once a stale handoff was taken back; s: stale's answer);
   and the branch that takes the key, free of writers and readers or ours
   already, opened: the key set with our TTL, we leave the waiting
   writers. The try goes on in that branch. */
#define WRITER_TRY(signal)                                                 \
  ERA_FN                                                                   \
  LIST_FN                                                                  \
  STALE_FN_OF("KEYS[2]", signal)                                           \
  NOW                                                                      \
  "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"                 \
  "redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)\n"                 \
  "local v = redis.call('GET', KEYS[2])\n"                                 \
  "local s = v and v ~= ARGV[1] and stale(v)\n"                            \
  "if s == 0 then v = false end\n"                                         \
  "if v == ARGV[1] or (not v and redis.call('ZCARD', KEYS[1]) == 0) then\n" \
  "  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])\n"                 \
  "  redis.call('ZREM', KEYS[4], ARGV[1])\n"

/* write_acquire: KEYS readers, writer, fence, writers, waiters, era,
   signal; ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] stay (ms). Takes the
   writer key when no writer holds it and no reader does; else queues the
   token among the waiting writers for the stay (which keeps new readers
   out). The write lock handed to a writer that never took it up is taken
   back (stale). Replies as acquire: the fence, or -2 - ms until it may
   change (the writer's PTTL, or the last reader's expiry). */
static const char write_acquire_script[] =
  WRITER_TRY("KEYS[7]")
  "  redis.call('ZREM', KEYS[5], ARGV[1])\n"
  FENCE_OF("KEYS[3]", "KEYS[6]", "v")
  "end\n"
  "redis.call('ZADD', KEYS[4], " FMT "now + tonumber(ARGV[3])), ARGV[1])\n"
  "redis.call('PEXPIRE', KEYS[4], ARGV[3])\n"
  RW_LEFT
  RW_MARK("KEYS[5]")
  "return -2 - left\n";

/* write_acquire_wait: KEYS readers, writer, fence, writers, signal, era,
   queue, hand; ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] the TTL a handoff
   gives it (ms, as acquire_wait's), ARGV[4] stay (ms). A waiting
   writer's try: write_acquire's, which also registers it for a handoff
   of the write lock (see "Handing over": a write release, or the last
   reader's, hands it the writer key with its token), and drops its
   registration when it takes the lock. Replies as write_acquire. */
static const char write_acquire_wait_script[] =
  WRITER_TRY("KEYS[5]")
  "  redis.call('ZREM', KEYS[7], ARGV[1])\n"
  "  redis.call('HDEL', KEYS[8], ARGV[1])\n"
  "  if v then list('DEL', KEYS[5] .. ':' .. ARGV[1]) end\n"
  FENCE_OF("KEYS[3]", "KEYS[6]", "v")
  "end\n"
  "redis.call('ZADD', KEYS[4], " FMT "now + tonumber(ARGV[4])), ARGV[1])\n"
  "redis.call('PEXPIRE', KEYS[4], ARGV[4])\n"
  REGISTER_IN("KEYS[5]", "KEYS[7]", "KEYS[8]", "ARGV[3]")
  RW_LEFT
  "return -2 - left\n";

/* write_release: KEYS writer, signal, waiters, queue, hand, fence, era,
   writers; ARGV[1] token. Compare-and-delete, or a handoff to the first
   registered writer (RW_HAND_OR_WAKE, under pcall as release's: the key
   then takes the heir's token in place of ours), else every waiter woken.
   Replies as release. */
static const char write_release_script[] =
  ERA_FN
  LIST_FN
  "local v = redis.call('GET', KEYS[1])\n"
  "if v == ARGV[1] then\n"
  "  local handed = false\n"
  "  if redis.call('EXISTS', KEYS[3], KEYS[4]) > 0 then pcall(function()\n"
  NOW
  RW_HAND_OR_WAKE("KEYS[1]", "KEYS[2]", "KEYS[3]", "KEYS[4]", "KEYS[5]", "KEYS[6]", "KEYS[7]", "KEYS[8]")
  "  end) end\n"
  "  if not handed then redis.call('DEL', KEYS[1]) end\n"
  "  return 1\n"
  "end\n"
  "if v then return -2 - redis.call('PTTL', KEYS[1]) end\n"
  "return 0\n";

/* write_extend: KEYS writer; ARGV[1] token, ARGV[2] ttl (ms) */
static const char write_extend_script[] = KEY_EXTEND;

/* write_pttl: KEYS writer; ARGV[1] token */
static const char write_pttl_script[] = KEY_PTTL;

/* write_leave: KEYS writers, writer, signal, waiters, queue, hand;
   ARGV[1] token. A waiting writer gives up: it leaves the queues; a write
   lock handed to it meanwhile is released; and when no writer holds the
   lock, the first registered writer is woken (it tries again at once) and
   so is every other waiter (readers it kept out). */
static const char write_leave_script[] =
  LIST_FN
  "redis.call('ZREM', KEYS[1], ARGV[1])\n"
  "redis.call('ZREM', KEYS[5], ARGV[1])\n"
  "redis.call('HDEL', KEYS[6], ARGV[1])\n"
  "if redis.call('GET', KEYS[2]) == ARGV[1] then\n"
  "  redis.call('DEL', KEYS[2])\n"
  "  list('DEL', KEYS[3] .. ':' .. ARGV[1])\n"
  "end\n"
  "if redis.call('EXISTS', KEYS[2]) == 0 then\n"
  NOW
  FIRST_LIVE("KEYS[5]", "KEYS[6]")
  "if heir then\n"
  WAKE_ONE("KEYS[3]")
  "end\n"
  WAKE_ALL("KEYS[3]", "KEYS[4]")
  "end\n"
  "return {0, 0}\n";

/* The ops, one row each (rl_ops.h says what a row holds). */
/* elect_extend: KEYS lock; ARGV[1] a leader's token, ARGV[2] ttl (ms). A
   leader's renewal: its extend, where the token is compared up to the
   value it carries (the leader is the same while it proclaims another:
   see "Elections"), so that a renewal on its way as the value changes
   does not find the lock another's. */
static const char elect_extend_script[] =
  "local v = redis.call('GET', KEYS[1])\n"
  "local id = string.match(ARGV[1], '^[^ ]*')\n"
  "if v and string.match(v, '^[^ ]*') == id then\n"
  "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
  "  return {1, tonumber(ARGV[2])}\n"
  "end\n"
  "if v then return {-1, redis.call('PTTL', KEYS[1])} end\n"
  "return {0, 0}\n";

const rl_op_row rl_ops[RL_OP_COUNT] = {
  [RL_OP_ACQUIRE] = { "acquire", acquire_script, { K_LOCK, K_FENCE, K_WAITERS, K_ERA, -1 }, RL_F_MS },
  [RL_OP_RELEASE] = { "release", release_script,
                    { K_LOCK, K_SIGNAL, K_QUEUE, K_HAND, K_WAITERS, K_FENCE, K_ERA, K_HANDOFF, -1 }, RL_F_ONCE },
  [RL_OP_EXTEND] = { "extend", extend_script, { K_LOCK, -1 }, RL_F_MS },
  [RL_OP_PTTL] = { "pttl", pttl_script, { K_LOCK, -1 }, 0 },
  [RL_OP_ACQUIRE_FAIR] = { "acquire_fair", acquire_fair_script,
                    { K_LOCK, K_FENCE, K_QUEUE, K_HAND, K_WAITERS, K_ERA, -1 }, RL_F_MS | RL_F_N | RL_F_STAY },
  [RL_OP_LEAVE] = { "leave", leave_script, { K_LOCK, K_SIGNAL, K_QUEUE, K_HAND, K_FENCE, K_ERA, K_HANDOFF, -1 },
                    RL_F_MS },
  [RL_OP_TAKE] = { "take", NULL, { K_LOCK, K_FENCE, K_WAITERS, K_ERA, -1 }, RL_F_MS },
  [RL_OP_RELEASE_ONE] = { "release_one", release_one_script, { K_LOCK, -1 }, RL_F_ONCE },
  [RL_OP_FENCE_UP] = { "fence_up", fence_up_script, { K_LOCK, K_FENCE, K_ERA, -1 }, RL_F_MS },
  [RL_OP_SEM_ACQUIRE] = { "sem_acquire", sem_acquire_script,
                    { K_PERMITS, K_PFENCE, K_PWAITERS, K_ERA, K_PHANDED, -1 }, RL_F_MS | RL_F_N },
  [RL_OP_SEM_RELEASE] = { "sem_release", sem_release_script,
                    { K_PERMITS, K_PSIGNAL, K_PWAITERS, K_PQUEUE, K_PHAND, K_PFENCE, K_ERA, K_PHANDED, -1 },
                    RL_F_ONCE },
  [RL_OP_SEM_EXTEND] = { "sem_extend", sem_extend_script, { K_PERMITS, -1 }, RL_F_MS },
  [RL_OP_SEM_PTTL] = { "sem_pttl", sem_pttl_script, { K_PERMITS, -1 }, 0 },
  [RL_OP_SEM_COUNT] = { "sem_count", sem_count_script, { K_PERMITS, -1 }, 0 },
  [RL_OP_READ_ACQUIRE] = { "read_acquire", read_acquire_script,
                    { K_READERS, K_WRITER, K_RWFENCE, K_WRITERS, K_RWWAITERS, K_ERA, K_RWSIGNAL, -1 },
                    RL_F_MS | RL_F_STAY },
  [RL_OP_READ_RELEASE] = { "read_release", read_release_script,
                    { K_READERS, K_RWSIGNAL, K_RWWAITERS, K_WRITER, K_RWQUEUE, K_RWHAND, K_RWFENCE, K_ERA,
                      K_WRITERS, -1 },
                    RL_F_ONCE },
  [RL_OP_READ_EXTEND] = { "read_extend", read_extend_script, { K_READERS, -1 }, RL_F_MS },
  [RL_OP_READ_PTTL] = { "read_pttl", read_pttl_script, { K_READERS, -1 }, 0 },
  [RL_OP_WRITE_ACQUIRE] = { "write_acquire", write_acquire_script,
                    { K_READERS, K_WRITER, K_RWFENCE, K_WRITERS, K_RWWAITERS, K_ERA, K_RWSIGNAL, -1 },
                    RL_F_MS | RL_F_STAY },
  [RL_OP_WRITE_RELEASE] = { "write_release", write_release_script,
                    { K_WRITER, K_RWSIGNAL, K_RWWAITERS, K_RWQUEUE, K_RWHAND, K_RWFENCE, K_ERA, K_WRITERS, -1 },
                    RL_F_ONCE },
  [RL_OP_WRITE_EXTEND] = { "write_extend", write_extend_script, { K_WRITER, -1 }, RL_F_MS },
  [RL_OP_WRITE_PTTL] = { "write_pttl", write_pttl_script, { K_WRITER, -1 }, 0 },
  [RL_OP_WRITE_LEAVE] = { "write_leave", write_leave_script,
                    { K_WRITERS, K_WRITER, K_RWSIGNAL, K_RWWAITERS, K_RWQUEUE, K_RWHAND, -1 }, 0 },
  [RL_OP_ACQUIRE_WAIT] = { "acquire_wait", acquire_wait_script,
                    { K_LOCK, K_FENCE, K_HANDOFF, K_ERA, -1 }, RL_F_MS | RL_F_N | RL_F_STAY },
  [RL_OP_SEM_ACQUIRE_WAIT] = { "sem_acquire_wait", sem_acquire_wait_script,
                    { K_PERMITS, K_PFENCE, K_PQUEUE, K_PHAND, K_PWAITERS, K_ERA, K_PHANDED, -1 },
                    RL_F_MS | RL_F_N | RL_F_STAY },
  [RL_OP_SEM_LEAVE] = { "sem_leave", sem_leave_script,
                    { K_PERMITS, K_PSIGNAL, K_PQUEUE, K_PHAND, K_PFENCE, K_ERA, K_PHANDED, -1 }, 0 },
  [RL_OP_ELECT_EXTEND] = { "elect_extend", elect_extend_script, { K_LOCK, -1 }, RL_F_MS },
  [RL_OP_WRITE_RELEASE_ONE] = { "write_release_one", release_one_script, { K_WRITER, -1 }, RL_F_ONCE },
  [RL_OP_READ_RELEASE_ONE] = { "read_release_one", zset_release_one_script, { K_READERS, -1 }, RL_F_ONCE },
  [RL_OP_SEM_RELEASE_ONE] = { "sem_release_one", zset_release_one_script, { K_PERMITS, -1 }, RL_F_ONCE },
  [RL_OP_WRITE_ACQUIRE_WAIT] = { "write_acquire_wait", write_acquire_wait_script,
                    { K_READERS, K_WRITER, K_RWFENCE, K_WRITERS, K_RWSIGNAL, K_ERA, K_RWQUEUE, K_RWHAND, -1 },
                    RL_F_MS | RL_F_N | RL_F_STAY },
};

const char *const rl_key_suffix[RL_NAMES] = {
  "", ":fence", ":signal", ":queue", ":hand", ":waiters", ":handoff",
  ":permits", ":permits:fence", ":permits:signal", ":permits:waiters",
  ":permits:queue", ":permits:hand", ":permits:handed",
  ":rw:readers", ":rw:writer", ":rw:fence", ":rw:writers", ":rw:signal", ":rw:waiters",
  ":rw:queue", ":rw:hand", ":era"
};

static char script_sha[RL_OP_COUNT][41];
static pthread_once_t script_sha_once = PTHREAD_ONCE_INIT;

const char *rl_script_text(rl_op op) { return rl_ops[op == RL_OP_TAKE ? RL_OP_ACQUIRE : op].script; }

const char *rl_op_name(rl_op op) { return rl_ops[op].name; }

int rl_op_takes_ms(rl_op op) { return (rl_ops[op].flags & RL_F_MS) != 0; }

int rl_op_takes_n(rl_op op) { return (rl_ops[op].flags & RL_F_N) != 0; }

int rl_op_resendable(rl_op op) { return (rl_ops[op].flags & RL_F_ONCE) == 0; }

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

/* The state of a lock: KEYS[1] the lock, [2] its fence counter, [3] the
   slot's era record: leaves state = {value or false, PTTL, the last fence
   or false}, the fence with the offset the era record holds (not checked
   against INFO: it writes nothing). For an election's lock, taken by the
   acquire scripts only, that fence is the leader's term. */
#define LOCK_STATE                                                         \
  "local v = redis.call('GET', KEYS[1])\n"                                 \
  "local fence = tonumber(redis.call('GET', KEYS[2]))\n"                   \
  "local r = redis.call('GET', KEYS[3])\n"                                 \
  "local off = r and tonumber(string.match(r, ' (%d+)$')) or 0\n"          \
  "local state = {v, redis.call('PTTL', KEYS[1]), fence and " FMT "fence + off) or false}\n"

/* inspect: KEYS lock, fence, era. What an operator asks about a lock, in
   one step: its state (LOCK_STATE). */
static const char inspect[] =
  LOCK_STATE
  "return state\n";

/* force_release: KEYS lock, signal, queue, hand, waiters, handoff. Deletes the lock
   whoever holds it (and a handoff's wake-up not yet taken up, so that the
   waiter it was for does not take it for the lock), and wakes one waiter
   (the first live registered one, which then takes it) as a release
   would; the fence counter stays, so fences keep growing. Replies 1, or 0
   when there was no lock. */
static const char force_release[] =
  LIST_FN
  "local v = redis.call('GET', KEYS[1])\n"
  "if not v then return 0 end\n"
  "redis.call('DEL', KEYS[1])\n"
  "list('DEL', KEYS[2] .. ':' .. v)\n"
  "if redis.call('EXISTS', KEYS[5], KEYS[6]) > 0 then pcall(function()\n"
  NOW
  FIRST_LIVE("KEYS[3]", "KEYS[4]")
  FIRST_READY("KEYS[6]")
  WAKE_ONE("KEYS[2]")
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

/* Elections (redislock/election.lua). A leader holds the lock
   <prefix>{election:<name>} (a lock taken by the acquire scripts only,
   never by a take, so that its fence counter is its holder's fence: the
   term); its token ends with " <value>". Observers are registered in
   <lock>:observers (a sorted set: token by the ms, server time, until which
   it stays) and each blocks on its own list <lock>:signal:<its token>,
   where every announcement is pushed: "<term> <leader's token>" by a new
   leader (or one that proclaimed a new value), "<term> " (no token) by
   one that resigned with nobody to follow it.

   ANNOUNCE(msg): pushes msg to every live observer's list (at most 1000;
   an observer gone past its stay leaves the set), kept for as long as its
   registration lasts, the last 100 only. Needs `now` and list(). */
#define ANNOUNCE(lock, observers, msg)                                     \
  "redis.call('ZREMRANGEBYSCORE', " observers ", '-inf', now)\n"            \
  "local obs = redis.call('ZRANGE', " observers ", 0, 999, 'WITHSCORES')\n" \
  "for i = 1, #obs, 2 do\n"                                                \
  "  local sig = " lock " .. ':signal:' .. obs[i]\n"                        \
  "  if not select(2, list('RPUSH', sig, " msg ")) then\n"                  \
  "    list('LTRIM', sig, -100, -1)\n"                                     \
  "    list('PEXPIRE', sig, " FMT "math.max(tonumber(obs[i + 1]) - now, 1)))\n" \
  "  end\n"                                                                \
  "end\n"

/* elect_observe: KEYS lock, fence, era, observers; ARGV[1] the observer's
   token, ARGV[2] how long its registration stays (ms). Registers it (or
   renews its stay) and takes what was announced to it since:
   {token or false, PTTL, term or false, {announcement, ...}}. */
static const char elect_observe[] =
  LIST_FN
  NOW
  LOCK_STATE
  "redis.call('ZADD', KEYS[4], " FMT "now + tonumber(ARGV[2])), ARGV[1])\n"
  "redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)\n"
  ZSET_EXPIRE("KEYS[4]")
  "local sig = KEYS[1] .. ':signal:' .. ARGV[1]\n"
  "local news = list('LRANGE', sig, 0, -1) or {}\n"
  "if #news > 0 then list('DEL', sig) end\n"
  "state[4] = news\n"
  "return state\n";

/* elect_announce: KEYS lock, observers; ARGV[1] the new leader's token
   and ARGV[2] its term; or, after a resign, ARGV[1] "" and ARGV[2] the
   term that ended. A leader announces itself only while the lock is its
   own (one paused after it won may find a later leader: not announced, so
   that observers hear of leaders in term order); a resign only while
   nobody leads (a release that handed the lead over leaves the
   announcement to the next leader). Replies how many observers were told,
   or -1. */
static const char elect_announce[] =
  LIST_FN
  NOW
  "local v = redis.call('GET', KEYS[1])\n"
  "if ARGV[1] == '' and v or ARGV[1] ~= '' and v ~= ARGV[1] then return -1 end\n"
  "local msg = ARGV[2] .. ' ' .. ARGV[1]\n"
  ANNOUNCE("KEYS[1]", "KEYS[2]", "msg")
  "return #obs / 2\n";

/* elect_proclaim: KEYS lock, observers; ARGV[1] the leader's token, [2]
   its new token (the same leader, another value), [3] its term, [4] its
   TTL (ms). While the lock is the leader's (its token up to the value, as
   elect_extend compares it: a resend after a lost answer finds the new
   one), swaps the token, the TTL renewed, and announces it: 1; else 0
   (free) or -1 (another's). */
static const char elect_proclaim[] =
  LIST_FN
  NOW
  "local v = redis.call('GET', KEYS[1])\n"
  "if not v or string.match(v, '^[^ ]*') ~= string.match(ARGV[1], '^[^ ]*') then return v and -1 or 0 end\n"
  "redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[4])\n"
  "if v == ARGV[2] then return 1 end\n"
  "local msg = ARGV[3] .. ' ' .. ARGV[2]\n"
  ANNOUNCE("KEYS[1]", "KEYS[2]", "msg")
  "return 1\n";

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
  { "elect_observe", elect_observe, "" },
  { "elect_announce", elect_announce, "" },
  { "elect_proclaim", elect_proclaim, "" },
};
#define NEXTRA (sizeof extra / sizeof extra[0])

/* Names every script, the ops' and the extra ones, once per process (Lua
   states in several threads may load the module at the same time). */
static void compute_script_shas(void) {
  size_t i;
  int op;
  for (op = 0; op < RL_OP_COUNT; op++)
    if (rl_ops[op].script != NULL) rl_sha1_hex(rl_ops[op].script, strlen(rl_ops[op].script), script_sha[op]);
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

