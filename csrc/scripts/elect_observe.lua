-- SPDX-License-Identifier: MIT
--! op elect_observe keys=lock,fence,observers flags=args,once
-- elect_observe (redislock/observe.lua): KEYS lock, fence, observers;
-- ARGV[1] the observer's token, ARGV[2] how long its registration stays
-- (ms). Registers it (or renews its stay) and takes what was announced to
-- it since (lib/announce.lua): {token or false, PTTL, term or false,
-- {announcement, ...}}.
--! include list lock_state server_time whole zset_expire
local now = server_time()
local state = lock_state(KEYS[1], KEYS[2])
redis.call('ZADD', KEYS[3], whole(now + tonumber(ARGV[2])), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
zset_expire(KEYS[3], now)
local sig = KEYS[1] .. ':signal:' .. ARGV[1]
local news = list('LRANGE', sig, 0, -1) or {}
if #news > 0 then list('DEL', sig) end
state[4] = news
return state
