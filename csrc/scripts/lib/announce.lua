-- SPDX-License-Identifier: MIT
--! include list whole
-- Elections (redislock/election.lua). A leader holds the lock
-- <prefix>{election:<name>} (a lock taken by the acquire scripts only,
-- never by a take, so that its fence counter is its holder's fence: the
-- term); its token ends with " <value>". Observers are registered in
-- <lock>:observers (a sorted set: token by the ms, server time, until which
-- it stays) and each blocks on its own list <lock>:signal:<its token>,
-- where every announcement is pushed: "<term> <leader's token>" by a new
-- leader (or one that proclaimed a new value), "<term> " (no token) by one
-- that resigned with nobody to follow it.
--
-- announce(lock, observers, msg, now) -> how many were told: pushes msg to
-- every live observer's list (at most 1000; an observer gone past its stay
-- leaves the set), kept for as long as its registration lasts, the last
-- 100 only.
local function announce(lock, observers, msg, now)
  redis.call('ZREMRANGEBYSCORE', observers, '-inf', now)
  local obs = redis.call('ZRANGE', observers, 0, 999, 'WITHSCORES')
  for i = 1, #obs, 2 do
    local sig = lock .. ':signal:' .. obs[i]
    if not select(2, list('RPUSH', sig, msg)) then
      list('LTRIM', sig, -100, -1)
      list('PEXPIRE', sig, whole(math.max(tonumber(obs[i + 1]) - now, 1)))
    end
  end
  return #obs / 2
end
