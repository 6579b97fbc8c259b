-- SPDX-License-Identifier: MIT
--! include list
-- The semaphore's shared steps: KEYS[1] its permits, a sorted set by
-- expiry; a permit's wake-up list is <permits>:signal:<token>.
--
-- sem_reclaim(permits, handed, now): drops the expired permits, and takes
-- back those handed to a waiter (handed: permits handed over by when, ms)
-- that did not take up its wake-up within RL_CLAIM_MS (README.md,
-- "Handing over").
local function sem_reclaim(permits, handed, now)
  redis.call('ZREMRANGEBYSCORE', permits, '-inf', now)
  for _, h in ipairs(redis.call('ZRANGEBYSCORE', handed, '-inf', now - RL_CLAIM_MS)) do
    local sig = permits .. ':signal:' .. h
    local n = list('LLEN', sig)
    if n and n > 0 and not select(2, list('DEL', sig)) then redis.call('ZREM', permits, h) end
    redis.call('ZREM', handed, h)
  end
end
