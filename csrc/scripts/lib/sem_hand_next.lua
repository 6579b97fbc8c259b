-- SPDX-License-Identifier: MIT
--! include first_live list next_fence wake_one whole zset_expire
-- sem_hand_next(permits, signal, queue, hand, rec, handed, now):
-- with a permit free, hands it to the first live registered waiter of the
-- semaphore (its own expiry, the fence that grows, the wake-up, as
-- hand_to_heir does for a lock; noted in handed, a sorted set), or wakes
-- one waiter of the shared list.
local function sem_hand_next(permits, signal, queue, hand, rec, handed, now)
  local heir, hms, since = first_live(queue, hand, now)
  local given = false
  if heir then
    local f = next_fence(rec)
    local sig = signal .. ':' .. heir
    local _, refused = list('RPUSH', sig, whole(f) .. ' ' .. whole(math.max(now - since, 0)) .. ' ' .. whole(now))
    if not refused then
      list('PEXPIRE', sig, hms)
      local r = redis.pcall('ZADD', permits, whole(now + tonumber(hms)), heir)
      if type(r) == 'table' and r.err then
        list('DEL', sig)
      else
        given = true
        zset_expire(permits, now)
        redis.call('ZREM', queue, heir)
        redis.call('HDEL', hand, heir)
        redis.call('ZADD', handed, now, heir)
        if redis.call('PTTL', handed) < tonumber(hms) then redis.call('PEXPIRE', handed, hms) end
      end
    end
  end
  if not given then wake_one(signal) end
end
