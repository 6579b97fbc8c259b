-- SPDX-License-Identifier: MIT
--! op leave keys=lock,signal,queue,hand,fence,era,handoff flags=ms
-- leave: KEYS lock, signal, queue, hand, fence, era, handoff; ARGV[1] token,
-- ARGV[2] the TTL it registered to be handed (a waiter in mode "notify":
-- see register_ready). A registered waiter gives up: it leaves the queue or
-- the handoff set; a lock handed to it meanwhile is passed on; and if the
-- lock is free the next waiter is handed it or woken (it would otherwise
-- wait for its own timeout).
--! include hand_next list ready_member server_time
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[7], ready_member(ARGV[2], ARGV[1]))
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[5])
  list('DEL', KEYS[2] .. ':' .. ARGV[1])
  v = false
end
if not v then
  hand_next(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], server_time())
end
return {0, 0}
