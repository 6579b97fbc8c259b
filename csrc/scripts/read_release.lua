-- SPDX-License-Identifier: MIT
--! op read_release keys=readers,rwsignal,rwwaiters,writer,rwqueue,rwhand,rwfence,era,writers flags=once
-- read_release: KEYS readers, signal, waiters, writer, queue, hand, fence,
-- era, writers; ARGV[1] token. The last reader out hands the write lock to
-- the first registered writer (rw_hand_or_wake, under pcall as release's
-- handoff), else wakes every waiter. Replies as sem_release.
--! include server_time
local now = server_time()
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(s) <= now then return 0 end
if redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') == 0
   and redis.call('EXISTS', KEYS[3], KEYS[5]) > 0 and redis.call('EXISTS', KEYS[4]) == 0 then
  -- The last reader out, and somebody may wait (the fragments come here:
  -- see release.lua).
  --! include rw_hand_or_wake
  pcall(rw_hand_or_wake, KEYS[4], KEYS[2], KEYS[3], KEYS[5], KEYS[6], KEYS[8], KEYS[9], now)
end
return 1
