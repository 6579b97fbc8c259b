-- SPDX-License-Identifier: MIT
--! op write_acquire_wait keys=readers,writer,rwfence,writers,rwsignal,era,rwqueue,rwhand flags=ms,n,stay
-- write_acquire_wait: KEYS readers, writer, fence, writers, signal, era,
-- queue, hand; ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] the TTL a handoff
-- gives it (ms, as acquire_wait's), ARGV[4] stay (ms). A waiting writer's
-- try: write_acquire's, which also registers it for a handoff of the write
-- lock (README.md, "Handing over": a write release, or the last reader's,
-- hands it the writer key with its token), and drops its registration when
-- it takes the lock. Replies as write_acquire.
--! include fence_of list register_in rw_left server_time whole writer_try
local now, t = server_time()
local v, s, took = writer_try(KEYS[1], KEYS[2], KEYS[4], KEYS[5], ARGV[1], ARGV[2], now)
if took then
  redis.call('ZREM', KEYS[7], ARGV[1])
  redis.call('HDEL', KEYS[8], ARGV[1])
  if v then list('DEL', KEYS[5] .. ':' .. ARGV[1]) end
  return fence_of(KEYS[3], KEYS[6])
end
redis.call('ZADD', KEYS[4], whole(now + tonumber(ARGV[4])), ARGV[1])
redis.call('PEXPIRE', KEYS[4], ARGV[4])
register_in(KEYS[5], KEYS[7], KEYS[8], ARGV[1], ARGV[3], ARGV[4], now, t)
return -2 - rw_left(KEYS[1], KEYS[2], v, s, now)
