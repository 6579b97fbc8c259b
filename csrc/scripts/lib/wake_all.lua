-- SPDX-License-Identifier: MIT
-- wake_all(signal, waiters, now): wakes every waiter of a read-write lock
-- (they wait by deadline in the sorted set waiters): one element each on
-- the signal list, at most 1000.
local function wake_all(signal, waiters, now)
  redis.call('ZREMRANGEBYSCORE', waiters, '-inf', now)
  local n = math.min(redis.call('ZCARD', waiters), 1000)
  if n > 0 then
    local ones = {}
    for i = 1, n do ones[i] = 1 end
    redis.call('DEL', signal)
    redis.call('RPUSH', signal, unpack(ones))
    redis.call('PEXPIRE', signal, RL_SIGNAL_MS)
  end
end
