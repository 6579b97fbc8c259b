-- SPDX-License-Identifier: MIT
--! op sem_acquire keys=permits,pfence,pwaiters,era,phanded flags=ms,n
-- sem_acquire: KEYS permits, fence, waiters, era, handed; ARGV[1] token,
-- ARGV[2] ttl (ms), ARGV[3] the limit. Expired permits are dropped first
-- (by the server's clock), and permits handed to waiters gone are taken
-- back; a token already holding a permit (a resend, or a permit handed to
-- it whose wake-up it did not wait for) keeps it. Replies as acquire: the
-- fence, or -2 - the ms until a permit may be free (the first one expires,
-- or one handed over lately may be taken back), and sets the waiters mark.
--! include sem_reclaim sem_take server_time whole
local now = server_time()
sem_reclaim(KEYS[1], KEYS[5], now)
local fence = sem_take(KEYS[1], KEYS[2], KEYS[4], ARGV[1], ARGV[2], ARGV[3], now)
if fence then return fence end
local left = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]) - now
local oldest = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')[2]
if oldest then left = math.min(left, math.max(tonumber(oldest) + RL_CLAIM_MS - now, 1)) end
redis.call('SET', KEYS[3], 1, 'PX', whole(math.max(left, 0) + RL_WAITERS_SLACK_MS))
return -2 - left
