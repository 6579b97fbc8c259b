-- SPDX-License-Identifier: MIT
--! op fenced_write keys= flags=args,named,once
-- fenced_write (redislock/guard.lua): KEYS the resource's fence record,
-- then the resource's keys; ARGV[1] the hold's fence, then the write (see
-- lib/write.lua). The write is applied only when the fence is at least the
-- highest the record accepted (which it then becomes): {1, the write's
-- reply}; else {0, that highest fence}. The write is one command, done or
-- refused whole; the record is written after it, so that a write the server
-- refuses (WRONGTYPE ...) leaves the record as it was. It never expires.
--! include write
local top = redis.call('GET', KEYS[1])
if top and tonumber(top) > tonumber(ARGV[1]) then return {0, top} end
local r = write(2, 2)
if top ~= ARGV[1] then redis.call('SET', KEYS[1], ARGV[1]) end
return {1, r}
