-- SPDX-License-Identifier: MIT
--! op owned_write keys= flags=args,named,once
-- owned_write (redislock/guard.lua): KEYS the hold's key (see lib/held.lua),
-- then the resource's keys; ARGV[1] the token, ARGV[2] how the hold is kept
-- ("string" or "zset"), then the write. Applied only while the hold is
-- ours: {1, the write's reply}; else {0}.
--! include held write
if not held(KEYS[1], ARGV[1], ARGV[2]) then return {0} end
return {1, write(2, 3)}
