-- SPDX-License-Identifier: MIT
--! op sem_leave keys=permits,psignal,pqueue,phand,pfence,era,phanded
-- sem_leave: KEYS permits, signal, queue, hand, fence, era, handed; ARGV[1]
-- token. A registered waiter gives up: it leaves the queue, and a permit
-- its token holds (handed to it meanwhile, or taken by a try whose answer
-- was lost: the client counts on neither) is passed on.
--! include list sem_hand_next server_time
local now = server_time()
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
list('DEL', KEYS[2] .. ':' .. ARGV[1])
redis.call('ZREM', KEYS[7], ARGV[1])
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s then
  redis.call('ZREM', KEYS[1], ARGV[1])
  if tonumber(s) > now then
    sem_hand_next(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7], now)
  end
end
return {0, 0}
