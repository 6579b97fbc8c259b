-- SPDX-License-Identifier: MIT
--! op extend keys=lock flags=ms
--! op write_extend keys=writer flags=ms
--! op pttl keys=lock
--! op write_pttl keys=writer
-- The lock's extend and PTTL (also a read-write lock's writer's): KEYS
-- the key; ARGV[1] token, ARGV[2] ttl (ms) for an extend, none for a PTTL.
-- Compare-and-pexpire. One key only, so that it runs on a cluster slot
-- half moved (a key missing on the target would be TRYAGAIN); a holder's
-- fence kept beside the lock (a lock a script granted: lib/grant.lua)
-- keeps the TTL it was granted with (an election's leadership extends its
-- term's: elect_extend). Replies {1, ms left} while the token holds the
-- key, {-1, ms left} while another does, {0, 0} when it is free.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  if not ARGV[2] then return {1, redis.call('PTTL', KEYS[1])} end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(ARGV[2])}
end
if v then return {-1, redis.call('PTTL', KEYS[1])} end
return {0, 0}
