-- SPDX-License-Identifier: MIT
-- Waiters in mode "notify" (README.md, "Handing over"): each is a member
-- "<ttl> <token>" of the lock's handoff set, scored by when its
-- registration lapses.
--
-- ready_member(ttl, token): a waiter's member, ttl the TTL to hand it (ms).
local function ready_member(ttl, token)
  return ttl .. ' ' .. token
end
