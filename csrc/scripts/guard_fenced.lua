-- SPDX-License-Identifier: MIT
--! guard fenced
-- A user's script run under a fence (redislock/guard.lua's eval): KEYS[1]
-- the resource's fence record, ARGV[1] the hold's fence (the check and
-- record of fenced_write.lua); the user's script runs as a function of its
-- own KEYS and ARGV (those after the guard's), and its reply comes back as
-- the second element. The record is written before the script runs: Redis
-- keeps what a script wrote before it failed, and that must stay guarded
-- by this fence.
local top = redis.call('GET', KEYS[1])
if top and tonumber(top) > tonumber(ARGV[1]) then return {0, top} end
if top ~= ARGV[1] then redis.call('SET', KEYS[1], ARGV[1]) end
local function user(KEYS, ARGV)
--! user
end
local keys, argv = {}, {}
for i = 2, #KEYS do keys[i - 1] = KEYS[i] end
for i = 2, #ARGV do argv[i - 1] = ARGV[i] end
return {1, user(keys, argv)}
