-- SPDX-License-Identifier: MIT
--! include era first_live list wake_one whole zset_expire
-- sem_hand_next(k, now): with a permit free, hands it to the first live
-- registered waiter of the semaphore (its own expiry, the fence that
-- grows, the wake-up, as hand_to_heir does for a lock; noted in
-- k.handed, a sorted set), or wakes one waiter of the shared list. k: {
-- permits, signal, queue, hand, fence, era, handed }.
local function sem_hand_next(k, now)
  local heir, hms, since = first_live(k.queue, k.hand, now)
  local given = false
  if heir then
    local f = redis.call('INCR', k.fence) + era(k.era)
    local sig = k.signal .. ':' .. heir
    local _, refused = list('RPUSH', sig, whole(f) .. ' ' .. whole(math.max(now - since, 0)) .. ' ' .. whole(now))
    if not refused then
      list('PEXPIRE', sig, hms)
      local r = redis.pcall('ZADD', k.permits, whole(now + tonumber(hms)), heir)
      if type(r) == 'table' and r.err then
        list('DEL', sig)
      else
        given = true
        zset_expire(k.permits, now)
        redis.call('ZREM', k.queue, heir)
        redis.call('HDEL', k.hand, heir)
        redis.call('ZADD', k.handed, now, heir)
        if redis.call('PTTL', k.handed) < tonumber(hms) then redis.call('PEXPIRE', k.handed, hms) end
      end
    end
  end
  if not given then wake_one(k.signal) end
end
