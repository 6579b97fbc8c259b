-- SPDX-License-Identifier: MIT
--! op pttl keys=lock
--! op write_pttl keys=writer
-- The lock's PTTL (also a read-write lock's writer's): KEYS the key;
-- ARGV[1] token.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  return {1, redis.call('PTTL', KEYS[1])}
end
if v then return {-1, redis.call('PTTL', KEYS[1])} end
return {0, 0}
