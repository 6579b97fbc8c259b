-- SPDX-License-Identifier: MIT
--! op elect_proclaim keys=lock,observers,fence flags=args,once
-- elect_proclaim (redislock/election_io.lua): KEYS lock, observers, fence; ARGV[1]
-- the leader's token, [2] its new token (the same leader, another value),
-- [3] its term, [4] its TTL (ms). While the lock is the leader's (its token
-- up to the value, as elect_extend compares it: a resend after a lost
-- answer finds the new one), swaps the token, the TTL renewed, and
-- announces it: 1; else 0 (free) or -1 (another's).
--! include announce server_time
local v = redis.call('GET', KEYS[1])
if not v or string.match(v, '^[^ ]*') ~= string.match(ARGV[1], '^[^ ]*') then return v and -1 or 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[4])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
if v == ARGV[2] then return 1 end
announce(KEYS[1], KEYS[2], ARGV[3] .. ' ' .. ARGV[2], server_time())
return 1
