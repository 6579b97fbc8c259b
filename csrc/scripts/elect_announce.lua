-- SPDX-License-Identifier: MIT
--! op elect_announce keys=lock,observers flags=args,once
-- elect_announce (redislock/election_io.lua): KEYS lock, observers; ARGV[1]
-- the new leader's token and ARGV[2] its term; or, after a resign, ARGV[1]
-- "" and ARGV[2] the term that ended. A leader announces itself only while
-- the lock is its own (one paused after it won may find a later leader:
-- not announced, so that observers hear of leaders in term order); a
-- resign only while nobody leads (a release that handed the lead over
-- leaves the announcement to the next leader). Replies how many observers
-- were told, or -1.
--! include announce server_time
local v = redis.call('GET', KEYS[1])
if ARGV[1] == '' and v or ARGV[1] ~= '' and v ~= ARGV[1] then return -1 end
return announce(KEYS[1], KEYS[2], ARGV[2] .. ' ' .. ARGV[1], server_time())
