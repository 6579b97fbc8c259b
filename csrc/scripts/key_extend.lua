-- SPDX-License-Identifier: MIT
--! op extend keys=lock flags=ms
--! op write_extend keys=writer flags=ms
-- The lock's extend (also a read-write lock's writer's): KEYS the key;
-- ARGV[1] token, ARGV[2] ttl (ms). Compare-and-pexpire. One key only, so
-- that it runs on a cluster slot half moved (a key missing on the target
-- would be TRYAGAIN); a holder's fence kept beside the lock (a lock a
-- script granted: lib/grant.lua) keeps the TTL it was granted with (an
-- election's leadership extends its term's: elect_extend).
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(ARGV[2])}
end
if v then return {-1, redis.call('PTTL', KEYS[1])} end
return {0, 0}
