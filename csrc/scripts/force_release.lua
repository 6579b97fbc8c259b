-- SPDX-License-Identifier: MIT
--! op force_release keys=lock,signal,queue,hand,waiters,handoff,fence flags=args,once
-- force_release (redislock/admin.lua): KEYS lock, signal, queue, hand,
-- waiters, handoff, fence. Deletes the lock whoever holds it, and its holder's fence (and a handoff's
-- wake-up not yet taken up, so that the waiter it was for does not take it
-- for the lock), and wakes one waiter (the first live registered one,
-- which then takes it) as a release would; fences keep growing (the slot's
-- record stays). Replies 1, or 0 when there was no lock.
--! include first_live first_ready list server_time wake_one
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
redis.call('DEL', KEYS[1], KEYS[7])
list('DEL', KEYS[2] .. ':' .. v)
if redis.call('EXISTS', KEYS[5], KEYS[6]) > 0 then
  pcall(function()
    local now = server_time()
    local heir = first_live(KEYS[3], KEYS[4], now) or first_ready(KEYS[6], now)
    wake_one(KEYS[2], heir)
  end)
end
return 1
