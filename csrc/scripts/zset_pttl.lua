-- SPDX-License-Identifier: MIT
--! op sem_pttl keys=permits
--! op read_pttl keys=readers
-- PTTL of a holder of a sorted set by expiry: KEYS[1] the set; ARGV[1]
-- token.
--! include server_time
local now = server_time()
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) <= now then return {0, 0} end
return {1, tonumber(s) - now}
