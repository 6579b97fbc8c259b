-- SPDX-License-Identifier: MIT
-- first_ready(handoff, now) -> heir, hms, since: pops the lock's waiters
-- registered in mode "notify" (its handoff set, members ready_member
-- makes, scored by when their registration lapses) until a live one, the one
-- renewed longest ago. Its registration is gone already, and with it
-- should the handoff then fail: the waiter registers again within a
-- second. Lapsed ones are dropped on the way.
local function first_ready(handoff, now)
  while true do
    local e = redis.call('ZPOPMIN', handoff)
    if not e[1] then return nil end
    if tonumber(e[2]) > now then
      local hms, heir = string.match(e[1], '^(%d+) (.+)$')
      if heir then return heir, hms, tonumber(e[2]) - RL_FAIR_STAY_MS end
    end
  end
end
