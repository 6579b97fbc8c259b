-- SPDX-License-Identifier: MIT
--! op write_acquire keys=readers,writer,rwfence,writers,rwwaiters,era,rwsignal flags=ms,stay
-- write_acquire: KEYS readers, writer, fence, writers, waiters, era, signal;
-- ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] stay (ms). Takes the writer key
-- when no writer holds it and no reader does; else queues the token among
-- the waiting writers for the stay (which keeps new readers out). The
-- write lock handed to a writer that never took it up is taken back
-- (stale). Replies as acquire: the fence, or -2 - ms until it may change
-- (the writer's PTTL, or the last reader's expiry).
--! include fence_of rw_left rw_mark server_time whole writer_try
local now = server_time()
local v, s, took = writer_try(KEYS[1], KEYS[2], KEYS[4], KEYS[7], ARGV[1], ARGV[2], now)
if took then
  redis.call('ZREM', KEYS[5], ARGV[1])
  return fence_of(KEYS[3], KEYS[6])
end
redis.call('ZADD', KEYS[4], whole(now + tonumber(ARGV[3])), ARGV[1])
redis.call('PEXPIRE', KEYS[4], ARGV[3])
local left = rw_left(KEYS[1], KEYS[2], v, s, now)
rw_mark(KEYS[5], ARGV[1], left, now)
return -2 - left
