-- SPDX-License-Identifier: MIT
--! op release keys=lock,signal,queue,hand,waiters,fence,era,handoff flags=once
-- release: KEYS lock, signal, queue, hand, waiters, fence (its holder's),
-- era (the slot's fence record), handoff; ARGV[1] token. The lock and its
-- holder's fence go, or the lock is handed over. The handoff or wake-up
-- runs only when the waiters mark or the handoff set is there, and under
-- pcall: a failure there (a key of the wrong type, no memory) must not turn
-- the release into an error, as Redis does not undo what ran before it;
-- the lock is deleted after it unless it was handed over. Replies one
-- integer: 1, 0 (no lock), or -2 - the PTTL of another owner's.
local v = redis.call('GET', KEYS[1])
if v ~= ARGV[1] then
  if v then return -2 - redis.call('PTTL', KEYS[1]) end
  return 0
end
if redis.call('EXISTS', KEYS[5], KEYS[8]) == 0 then
  redis.call('DEL', KEYS[1], KEYS[6])
  return 1
end
-- Somebody may wait. The fragments come here, so that a release with
-- nobody waiting (GET, EXISTS, DEL) does not make their functions.
--! include hand_next server_time
local ok, handed = pcall(hand_next, KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7], KEYS[8], server_time())
if not (ok and handed) then redis.call('DEL', KEYS[1], KEYS[6]) end
return 1
