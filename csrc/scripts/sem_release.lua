-- SPDX-License-Identifier: MIT
--! op sem_release keys=permits,psignal,pwaiters,pqueue,phand,pfence,era,phanded flags=once
-- sem_release: KEYS permits, signal, waiters, queue, hand, fence, era,
-- handed; ARGV[1] token. When the mark says somebody may wait, the permit
-- goes to the first live registered waiter, else one waiter is woken (under
-- pcall, as release's handoff). Replies 1, or 0 when the permit is gone
-- (expired, or taken back).
--! include server_time
local now = server_time()
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(s) <= now then return 0 end
if redis.call('EXISTS', KEYS[3]) == 0 then return 1 end
-- Somebody may wait (the fragments come here: see release.lua).
--! include sem_hand_next
pcall(sem_hand_next, KEYS[1], KEYS[2], KEYS[4], KEYS[5], KEYS[7], KEYS[8], now)
return 1
