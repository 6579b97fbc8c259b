-- SPDX-License-Identifier: MIT
--! op write_release keys=writer,rwsignal,rwwaiters,rwqueue,rwhand,rwfence,era,writers flags=once
-- write_release: KEYS writer, signal, waiters, queue, hand, fence, era,
-- writers; ARGV[1] token. Compare-and-delete, or a handoff to the first
-- registered writer (rw_hand_or_wake, under pcall as release's: the key
-- then takes the heir's token in place of ours), else every waiter woken.
-- Replies as release.
local v = redis.call('GET', KEYS[1])
if v ~= ARGV[1] then
  if v then return -2 - redis.call('PTTL', KEYS[1]) end
  return 0
end
if redis.call('EXISTS', KEYS[3], KEYS[4]) == 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
-- Somebody may wait (the fragments come here: see release.lua).
--! include rw_hand_or_wake server_time
local ok, handed = pcall(rw_hand_or_wake, KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[7], KEYS[8],
                         server_time())
if not (ok and handed) then redis.call('DEL', KEYS[1]) end
return 1
