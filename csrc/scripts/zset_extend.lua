-- SPDX-License-Identifier: MIT
--! op sem_extend keys=permits flags=ms
--! op read_extend keys=readers flags=ms
-- Extend of a holder of a sorted set by expiry (a permit, a read hold):
-- KEYS[1] the set; ARGV[1] token, ARGV[2] ttl (ms). An entry past its
-- expiry is gone.
--! include server_time whole zset_expire
local now = server_time()
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) <= now then
  if s then redis.call('ZREM', KEYS[1], ARGV[1]) end
  return {0, 0}
end
redis.call('ZADD', KEYS[1], whole(now + tonumber(ARGV[2])), ARGV[1])
zset_expire(KEYS[1], now)
return {1, tonumber(ARGV[2])}
