-- SPDX-License-Identifier: MIT
--- redislock.wait: taking a busy lock within a deadline. Between attempts a
-- waiter blocks on the lock's wake-up list (mode "notify": a release hands
-- the lock to one registered waiter, whose wake-up carries its fence), or
-- sleeps a jittered, doubling step (mode "poll"); a fair waiter queues on
-- the server. Failures that pass (a lost connection, a server loading its
-- data ...: TRANSIENT) are retried within the deadline. Shared by every
-- primitive that waits. What a runtime adds to waiting is its waiting
-- strategy's (the client's _waiting, see take): under OpenResty the
-- worker's gate (redislock/ngx_gate.lua); plain Lua has none.

local args = require("redislock.args")
local backoff = require("redislock.backoff")
local core = require("redislock.core")
local errors = require("redislock.errors")
local lock_mod = require("redislock.lock")
local transport = require("redislock.transport")

local type, tonumber = type, tonumber
local string_format = string.format
local math_max, math_min, math_floor = math.max, math.min, math.floor
local now, MAX_MS = core.now, core.MAX_MS
local quote, raise_at_caller = args.quote, args.raise_at_caller
local ours_by_clock = lock_mod.ours_by_clock
local retry = errors.retry

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

-- Backoff while waiting for a busy lock (redislock/backoff.lua's), never
-- past the caller's deadline nor (much) past the holder's expiry.
local FIRST_STEP, pause = backoff.FIRST, backoff.sleep

local function seconds_text(ms)
  if ms < 0 then return "no expiry set" end
  return string_format("%.3g s left", ms / 1000)
end

-- How late Redis may end a BLPOP that timed out (seconds): it checks the
-- timeouts of blocked clients at its tick, hz = 10 by default.
local BLPOP_SLACK = 0.1

-- A fair waiter comes back at least this often (seconds), so that the queue
-- keeps it: the server drops one that stays away 3 s (RL_FAIR_STAY_MS).
local FAIR_STEP = 1

-- A waiter that renews its lock (how.renew) and whose TTL is over twice
-- this is handed the lock with this TTL (ms) first: its renewal, due at
-- once, extends it (see take). Time enough for a renewal that fails to be
-- tried again (the watchdog's next try comes 1 s later at most).
local HAND_MS = 3000

-- Whole milliseconds, at least 1, for a wait of s seconds.
local function wait_ms(s)
  return math_max(1, math_floor(s * 1000 + 0.5))
end

-- The busy message after an attempt that answered value (the holder's PTTL,
-- or -2 when a fair lock is free but promised to earlier waiters); mine: the
-- lock this very client holds there, if any. Under OpenResty a worker's
-- requests share its client: one request waiting for another's lock is
-- plain contention, told apart by the request (transport.context).
local function busy_message(key, value, waited, mine)
  local state, detail = "held by another owner", seconds_text(value)
  local context = mine and mine._context
  if value == -2 then
    state, detail = "promised to earlier waiters", "fair queue"
  elseif context and context ~= transport.context() then
    state = "held by another request of this nginx worker"
  elseif mine then
    state, detail = context and "held by this request" or "held by this client", "locks are not reentrant; " .. detail
  end
  if waited > 0 then
    return string_format("busy: %s is still %s after waiting %.3g s (%s)", quote(key), state, waited, detail)
  end
  return string_format("busy: %s is %s (%s)", quote(key), state, detail)
end

-- What is worth retrying within the wait: a lost connection, and replies
-- that mean "this server will answer later": a restart loading its data
-- (LOADING), a script running (BUSY), a replica cut off from its master
-- (MASTERDOWN), a master demoted by a failover (READONLY) or a waiter
-- unblocked by one (UNBLOCKED), a cluster slot moving or a cluster without
-- quorum (TRYAGAIN, CLUSTERDOWN); behind Sentinel, on the master it names
-- then. Every lock script checks the token, so a resend is always
-- reconciled. The one table of them is redislock/errors.lua's ("wait";
-- its server codes are redislock.TRANSIENT).

-- Whether an error message (from eval) is worth retrying within the wait.
local function retryable(err)
  return retry(err, "wait")
end

-- Keys remembered as busy per client, at most this many (then forgotten at once).
local HOT_MAX = 1024

-- Remembers that key was found busy by a caller that waits (see take).
local function note_hot(hot, key)
  if hot.keys[key] then return end
  if hot.n >= HOT_MAX then
    hot.keys, hot.n = {}, 0
  end
  hot.keys[key] = true
  hot.n = hot.n + 1
end

-- Forgets that key was found busy: a take found it free at once.
local function cool(hot, key)
  if hot.keys[key] then hot.keys[key], hot.n = nil, hot.n - 1 end
end

--- How a primitive is taken: its scripts (take: the first try; acquire: the
-- tries after it; hand: the tries after it of a waiter that blocks, which
-- register it for a handoff; fair and leave: a fair waiter's, and leave
-- also a registered one's), whether a waiter stays
-- queued on the server (stays: it must come back within a second, and
-- leaves the queue when it gives up, as a fair waiter), the wake-up list it
-- blocks on (wait: an op of its primitive, nil for the lock's), n (passed to
-- the scripts: a semaphore's limit), busy (key, value, waited, mine) -> the
-- "busy: ..." message, and eval: in place of t:eval, for a primitive of many
-- keys (redislock/multilock.lua), which answers -1, the PTTL and the key to
-- block on when one is busy; keyed: it is the lock's own key and scripts (a
-- lock; an election's leadership, redislock/election.lua); first_ttl: a
-- renewing waiter is handed it with a short first TTL (HAND_MS), as keyed
-- ones are (a read-write lock's writer); unwoken: a handoff to others may
-- leave it unwoken, so it comes back at least every FAIR_STEP (a
-- read-write lock's reader); cohort: a waiting strategy may hand it down
-- to its next waiter, without a word to Redis (a lock's, see take). The lock's:
_M.LOCK = { take = "take", acquire = "acquire", hand = "acquire_wait", fair = "acquire_fair", leave = "leave",
            keyed = true, cohort = true }
local LOCK = _M.LOCK

-- A handoff's wake-up (csrc/scripts/README.md, "Handing over"):
-- "<fence> <age> <at>", age the ms between the waiter's registration and
-- the handoff, by the server's clock. Returns the fence and the time the
-- lock was handed over, by ours (core.now()): the registering try was sent
-- at sent, and its answer came no earlier than the handoff did. nil for a
-- plain wake-up.
local function handoff(woke, sent)
  if type(woke) ~= "string" then return nil end
  local fence, age = woke:match("^(%d+) (%d+) %d+$")
  if not fence then return nil end
  return tonumber(fence), math_max(sent, math_min(sent + tonumber(age) / 1000, now()))
end

-- The busy answer of take when the wait ran out after an attempt that
-- answered value (kind.busy's, or the lock's; held: the client's _held).
local function busy_answer(kind, key, value, wait, held)
  if kind.busy then return nil, kind.busy(key, value, wait) end
  local mine = held[key]
  return nil, busy_message(key, value, wait, ours_by_clock(mine) and mine or nil)
end

-- The waiter of a take without a waiting strategy (plain Lua), or that
-- its strategy leaves alone: its steps (see take) do nothing.
local function yes() return true end
local function none() return nil end
local ALONE = { queued = none, enter = yes, noted = yes, trying = none, blocking = function(_, block) return block end,
                handed = none, drop = none, pending = none, took = none, quit = none, give_up = none }

-- Tells the client's observer that key (of kind) was handed over to this
-- waiter: by its holder's release on Redis, or within the nginx worker.
local function told_handoff(client, key, kind)
  lock_mod.observe(client._link, "handoff", { key = key, kind = kind.ops and kind.ops.kind or "lock" })
end

-- A take (of kind, nil: a lock) that is one try, at once: nothing of
-- take's loop but the try (no wait, no registration, nothing more to tell
-- the script, no place to leave, no lock delay): every uncontended acquire.
-- Returns its fence and when it was sent (core.now()), or nil, an error
-- message and what its call left of the lock its take took (eval's third
-- value on a failure: "nothing", "staying" or nil, see
-- redislock/transport.lua); false (nothing sent) for a take that is more.
-- No table is made.
local function try(client, key, tok, ms, how, kind)
  kind = kind or LOCK
  if how.wait ~= 0 or how.fair or how.replicas or kind.n or kind.stays or how.delay_ms then return false end
  local c, hot = client._transport, client._hot
  local sent = now()
  local status, value, left = (kind.eval or c.eval)(c, kind.take, key, tok, ms)
  if status == 1 then
    if hot.keys[key] then hot.keys[key], hot.n = nil, hot.n - 1 end -- free at once: cooled down
    return value, sent
  end
  if status == nil then return nil, value, left end
  return busy_answer(kind, key, value, 0, client._held)
end

-- Tries to take key with token until how.wait seconds have passed. Between
-- attempts it blocks on the lock's wake-up list (mode "notify": release
-- wakes one waiter, and a block never outlasts the holder's TTL or the
-- deadline), or sleeps a jittered, doubling step (mode "poll", and after a
-- connection error). A fair waiter queues on the server and leaves the queue
-- when it gives up. The same token is resent after a connection error: the
-- acquire scripts treat "the key already holds my token" as success, so a
-- send that landed is not counted twice.
--
-- A take that waits asks its client's waiting strategy (client._waiting,
-- the runtime's: redislock/transport.lua's waiting) for a waiter, whose
-- steps it takes; without one, ALONE's. strategy:waiter(client, key, how,
-- kind) -> waiter | nil, whose methods:
--   queued() -> whether others wait there before it (then it enters);
--   enter(deadline[, value]) -> true | false, news: takes its turn behind
--     them by deadline (value: its last try's answer); news: the value to
--     tell when it gave up;
--   noted(value) -> whether it took its turn already (else it enters now),
--     keeping its last try's answer for those behind it;
--   trying(t): a try is sent at t (core.now()); blocking(s) -> how long
--     it may block for s seconds of wait;
--   handed(how, ms) -> token, fence, cohort | nil: a lock handed down to it
--     within the runtime, to take over with its token, as it is when a
--     fence comes too (cohort: a record that goes with the lock);
--   drop() -> true when it dropped a handed lock a try found gone;
--   pending() -> whether a handed lock waits to be taken over;
--   took(how, ms, deadline) -> cohort | nil: the take succeeded (the cohort
--     record when the lock keeps its place: redislock/ngx_gate.lua's hold);
--   quit(), give_up(token): it leaves (give_up: and gives a handed lock,
--     held with token, back to Redis).
-- Returns a record { fence, sent (when the successful try was sent), acked
-- (with how.replicas: how many replicas acknowledged it, or nil and werr:
-- why the WAIT failed), token (tok, or that of a lock handed down),
-- cohort, expires (when a handoff gave it a first TTL shorter than ms,
-- when that TTL ends: core.now()), delay (the lock delay it added:
-- how.delay_ms) }; or nil, an error message and, when its last try failed
-- so, what that try left of the lock (as try's).
local function take(client, key, tok, ms, how, kind)
  kind = kind or LOCK
  local one, at, remains = try(client, key, tok, ms, how, kind)
  if one then return { fence = one, sent = at, token = tok } end -- no replicas to WAIT for here
  if one == nil then return nil, at, remains end
  local own_tok = tok
  local c, sleep, held, hot = client._transport, client._sleep, client._held, client._hot
  local wait, fair = how.wait, how.fair
  -- A waiter that blocks registers for a handoff on each try (unless
  -- told not to; not on a Redlock, where a release on a majority hands
  -- nothing over).
  local hand = wait > 0 and not fair and how.mode ~= "poll" and how.handoff and c.handoff ~= false and kind.hand
  local stays = fair or kind.stays or hand
  local w = wait > 0 and client._waiting and client._waiting:waiter(client, key, how, kind) or ALONE
  -- What else each try tells the script: a semaphore's limit, the replicas to WAIT for.
  -- The TTL a handoff of a lock gives it (a registering try's n; a
  -- semaphore's n is its limit, and a permit handed over has the waiter's
  -- TTL): its own, or, when its renewal extends the lock at once and that
  -- TTL is long, HAND_MS, so that a waiter paused as it is handed the lock
  -- keeps the others out that long at most (the renewal of one that runs
  -- makes it its TTL).
  local hand_ms = (how.renew and ms > 2 * HAND_MS and (kind.keyed or kind.first_ttl)) and HAND_MS or ms
  -- A lock delay (how.delay_ms) lengthens what the server keeps, never the
  -- holder's own TTL (ms): the hold lasts on Redis that much past the time
  -- its holder stops counting it as its own.
  local delay = how.delay_ms
  local wire_ms = ms
  if delay then
    wire_ms = ms + delay
    if wire_ms > MAX_MS then
      raise_at_caller(string_format("bad argument (ttl and option 'lock_delay' must add up to at most %.3f s)",
                                    MAX_MS / 1000))
    end
  end
  local more = (kind.n or how.replicas or hand or fair)
    and { n = kind.n or (delay and hand_ms + delay or hand_ms), replicas = how.replicas,
          replica_ms = how.replica_ms } or nil
  -- The first try is a take (no script, the cheapest for Redis); the tries
  -- after it are the acquire script, which also marks a waiter. A caller
  -- that will wait for a key this client found busy lately starts with the
  -- script: a take would most likely find it busy too, and cost a round trip.
  local op = fair and kind.fair or (wait > 0 and hot.keys[key]) and (hand or kind.acquire) or kind.take
  local eval = kind.eval or c.eval
  local first = true
  local deadline = now() + wait
  local step = FIRST_STEP
  -- A handoff's fence, time, and when its TTL (hand_ms) ends when shorter
  -- than ms; when the last try was sent.
  local got, got_at, expires, sent
  if w:queued() then -- others wait there before it: it takes its turn behind them
    local ok, news = w:enter(deadline)
    if not ok then return busy_answer(kind, key, news, wait, held) end
  end
  while true do
    local handed, fence, cohort = w:handed(how, ms)
    if handed then
      tok, op = handed, kind.acquire
      if fence then
        if client._link.observer then told_handoff(client, key, kind) end
        return { fence = fence, sent = now(), token = tok, cohort = cohort, delay = delay }
      end
    end
    local status, value, acked, werr, tried -- a failure's third value (acked's place) is its left
    if got then -- handed over by its holder's release: held already
      status, value, sent, got = 1, got, got_at, nil
      if client._link.observer then told_handoff(client, key, kind) end
    else
      sent, tried = now(), op
      w:trying(sent)
      status, value, acked, werr = eval(c, op, key, tok, wire_ms, more)
    end
    if status == 1 then
      if first then cool(hot, key) end
      return { fence = value, sent = sent, acked = acked, werr = werr, token = tok,
               cohort = w:took(how, ms, deadline), expires = expires, delay = delay }
    end
    -- A lock handed down and found gone, or another's: not this take's,
    -- nor its token (after a connection error it may be, and is kept).
    if status ~= nil and w:drop() then tok, op = own_tok, hand or kind.acquire end
    if status == -1 and wait > 0 then note_hot(hot, key) end
    if op == kind.take then op = hand or kind.acquire end
    -- Registered: the release hands the lock over on its own list.
    local registered = tried ~= nil and (tried == (fair and kind.fair) or tried == hand)
    first = false
    local queued = false
    if status ~= nil and not w:noted(value) then -- busy: it takes its turn now, behind others waiting there
      queued = w:queued()
      if queued and stays then c:eval(kind.leave, key, tok, hand_ms) end -- its place is their queue
      local ok, news = w:enter(deadline, value)
      if not ok then return busy_answer(kind, key, news, wait, held) end
    end
    local left = deadline - now()
    -- A lock just handed down is taken over first, whatever the deadline says.
    if (left <= 0 and not (queued and w:pending())) or (status == nil and not retryable(value)) then
      if stays then c:eval(kind.leave, key, tok, hand_ms) end -- best effort: else it drops out in 3 s
      w:give_up(tok)
      if status == nil then return nil, value, acked end
      return busy_answer(kind, key, value, wait, held)
    end
    -- How long the lock can stay as it is: until the holder's TTL runs out.
    local block = left
    if status == -1 and value >= 0 then block = math_min(block, value / 1000 + 0.001) end
    -- A registered waiter comes back to keep its registration; a lock's
    -- waiter that is not (a multi-key lock's, handoff = false) as often:
    -- registered ones may be handed the lock one after another, and it
    -- would not hear of it while it blocks. So does a read-write lock's
    -- reader (kind.unwoken): a write lock handed to a writer gone, which
    -- the next try takes back, wakes nobody.
    if stays or ((kind.keyed or kind.eval or kind.unwoken) and c.handoff ~= false) then
      block = math_min(block, FAIR_STEP)
    end
    block = w:blocking(block) -- others may wait behind it: it says how long it will be
    if queued or (hand and status == -1 and not registered) then
      -- Its turn came behind others, or a take found the lock held: it
      -- tries again at once (registering, when it is to be handed the lock).
      step = FIRST_STEP
    elseif status ~= nil and how.mode ~= "poll" and block > 1.5 * BLPOP_SLACK then
      -- Redis ends a BLPOP that timed out only at its next tick (10 a second
      -- by default): block that much less, and sleep what is left near the end.
      local on = status == -1 and acked or key -- a multi-key lock's busy key
      local woke, blerr = c:wait(on, registered and tok or nil, wait_ms(block - BLPOP_SLACK), kind.wait)
      if woke == nil and blerr and not retryable(blerr) then
        -- Refused (NOPERM: a user without +blpop), not a passing state: an
        -- error, as every refused command is, never a wait that polls
        -- unawares. Its registration goes (best effort).
        if stays then c:eval(kind.leave, key, tok, hand_ms) end
        w:give_up(tok)
        return nil, blerr
      elseif woke == nil then
        step = pause(sleep, step, block) -- the wait failed: back off
      elseif not how.replicas then -- with replicas to wait for, the next try WAITs for them
        got, got_at = handoff(woke, sent)
        expires = got and hand_ms < ms and got_at + hand_ms / 1000 or nil
      end
    else
      -- Polling, after a connection error, or near the holder's expiry or
      -- the deadline: short backoff steps, so that a release meanwhile is
      -- not slept through.
      step = pause(sleep, step, block)
    end
  end
end

--- take(client, key, tok, ms, how[, kind]) -> { fence, sent, acked, werr, token, cohort, expires, delay } |
-- nil, err[, left]
-- Tries to take key with tok through the client's transport until how.wait
-- seconds passed (see above), sleeping with its sleep; it reads the
-- client's _held (the locks it holds, for the "held by this client"
-- message) and _hot ({ keys = {}, n = 0 }: keys it found busy lately);
-- kind: how the primitive is taken (_M.LOCK by default).
_M.take = take

--- try(client, key, tok, ms, how[, kind]) -> fence, sent | nil, err[, left] |
-- false: a take that is one try at once, without the record (hold.lua's
-- acquire, for every uncontended one); false when it is more: take then.
_M.try = try

--- not_taken(client, key, status, value, left) -> nil, err[, left]: what
-- try answers when its try of a lock was answered status and value (and
-- left, when it failed: rl_lua_push_failed's), not 1 (for the
-- common case's, made in one call: redislock/hold.lua's taken). cool(hot,
-- key): key (of the client's _hot) was found free at once.
function _M.not_taken(client, key, status, value, left)
  if status == nil then return nil, value, left end
  return busy_answer(LOCK, key, value, 0, client._held)
end
_M.cool = cool

--- busy_message(key, value, waited, mine): the "busy: ..." message of a
-- lock after an attempt that answered value; mine: the lock this client
-- holds there, or nil (see above).
_M.busy_message = busy_message

return _M
