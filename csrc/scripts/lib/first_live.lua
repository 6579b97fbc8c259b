-- SPDX-License-Identifier: MIT
-- Who is handed a lock (README.md, "Handing over"). now: ms, server time.
--
-- first_live(queue, hand, now) -> heir, hms, since: the fair queue's first
-- live waiter (nil when none), the TTL to hand it (ms), and when it
-- registered (ms). Waiters found dead on the way (past their deadline, or
-- with no registration: left by an eviction or a partial delete) leave the
-- queue. A registration is "<deadline> <ttl>", its deadline
-- RL_FAIR_STAY_MS after it was made.
local function first_live(queue, hand, now)
  while true do
    local heir = redis.call('ZRANGE', queue, 0, 0)[1]
    if not heir then return nil end
    local r = redis.call('HGET', hand, heir)
    local due, ttl = string.match(r or '', '^(%d+) (%d+)$')
    if due and tonumber(due) > now then
      return heir, ttl, tonumber(due) - RL_FAIR_STAY_MS
    end
    redis.call('ZREM', queue, heir)
    if r then redis.call('HDEL', hand, heir) end
  end
end
