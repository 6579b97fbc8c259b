-- SPDX-License-Identifier: MIT
--! op sem_holders keys=permits flags=args
-- sem_holders (redislock/semaphore.lua): KEYS permits. Who holds a permit
-- now, for an operator (redislock status): { token, ms left, token, ms
-- left ... }, the first to expire first; expired permits left out.
--! include server_time
local now = server_time()
local held = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
for i = 2, #held, 2 do held[i] = tonumber(held[i]) - now end
return held
