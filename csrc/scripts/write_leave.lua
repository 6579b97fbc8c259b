-- SPDX-License-Identifier: MIT
--! op write_leave keys=writers,writer,rwsignal,rwwaiters,rwqueue,rwhand
-- write_leave: KEYS writers, writer, signal, waiters, queue, hand; ARGV[1]
-- token. A waiting writer gives up: it leaves the queues; a write lock
-- handed to it meanwhile is released; and when no writer holds the lock,
-- the first registered writer is woken (it tries again at once) and so is
-- every other waiter (readers it kept out).
--! include first_live list server_time wake_all wake_one
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  list('DEL', KEYS[3] .. ':' .. ARGV[1])
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  local now = server_time()
  local heir = first_live(KEYS[5], KEYS[6], now)
  if heir then wake_one(KEYS[3], heir) end
  wake_all(KEYS[3], KEYS[4], now)
end
return {0, 0}
