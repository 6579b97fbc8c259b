-- SPDX-License-Identifier: MIT
--! guard owned
-- A user's script run while a hold is ours (redislock/guard.lua's eval):
-- KEYS[1] the hold's key, ARGV[1] the token, ARGV[2] how the hold is kept
-- (owned_write.lua's check); the user's script runs as a function of its
-- own KEYS and ARGV (those after the guard's), and its reply comes back as
-- the second element.
--! include held
if not held(KEYS[1], ARGV[1], ARGV[2]) then return {0} end
local function user(KEYS, ARGV)
--! user
end
local keys, argv = {}, {}
for i = 2, #KEYS do keys[i - 1] = KEYS[i] end
for i = 3, #ARGV do argv[i - 2] = ARGV[i] end
return {1, user(keys, argv)}
