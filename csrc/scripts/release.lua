-- SPDX-License-Identifier: MIT
--! op release keys=lock,waiters,fence,handoff,signal,queue,hand,era first=4 flags=once
-- release: KEYS lock, waiters, fence (its holder's), handoff, then signal,
-- queue, hand, era (the slot's fence record); ARGV[1] token. The lock and
-- its holder's fence go, or the lock is handed over. The core sends the
-- first four names only (first=4: Redis makes a string of every name on
-- every call): when the waiters mark or the handoff set is there, the
-- script answers RL_ALL_KEYS having changed nothing, and the core sends
-- it again with all eight; and the name's next releases with all eight
-- from the start, until one answers RL_NO_WAITERS (1 to the caller:
-- nobody waited). The handoff or wake-up runs under pcall: a failure
-- there (a key of the wrong type, no memory) must not turn the release
-- into an error, as Redis does not undo what ran before it; the lock is
-- deleted after it unless it was handed over. Replies one integer: 1, 0
-- (no lock), or -2 - the PTTL of another owner's.
local v = redis.call('GET', KEYS[1])
if v ~= ARGV[1] then
  if v then return -2 - redis.call('PTTL', KEYS[1]) end
  return 0
end
if redis.call('EXISTS', KEYS[2], KEYS[4]) == 0 then
  redis.call('DEL', KEYS[1], KEYS[3])
  return KEYS[8] and RL_NO_WAITERS or 1
end
if not KEYS[8] then return RL_ALL_KEYS end
-- Somebody may wait. The fragments come here, so that a release with
-- nobody waiting (GET, EXISTS, DEL) does not make their functions.
--! include hand_next server_time
local ok, handed = pcall(hand_next, KEYS[1], KEYS[5], KEYS[6], KEYS[7], KEYS[3], KEYS[8], KEYS[4], server_time())
if not (ok and handed) then redis.call('DEL', KEYS[1], KEYS[3]) end
return 1
