-- SPDX-License-Identifier: MIT
--! op extend keys=lock flags=ms
--! op write_extend keys=writer flags=ms
-- The lock's extend (also a read-write lock's writer's): KEYS the key;
-- ARGV[1] token, ARGV[2] ttl (ms). Compare-and-pexpire.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(ARGV[2])}
end
if v then return {-1, redis.call('PTTL', KEYS[1])} end
return {0, 0}
