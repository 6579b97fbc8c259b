-- SPDX-License-Identifier: MIT
--! op inspect keys=lock,fence flags=args
-- inspect (redislock/admin.lua): KEYS lock, fence. What an operator
-- asks about a lock, in one step: its state (lock_state).
--! include lock_state
return lock_state(KEYS[1], KEYS[2])
