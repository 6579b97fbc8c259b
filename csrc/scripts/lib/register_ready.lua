-- SPDX-License-Identifier: MIT
--! include list whole
-- register_ready(signal, handoff, token, member, stay, now): registers
-- the waiter token as member of the handoff set, lapsing stay ms from now
-- (a waiter comes back within a second), and the set kept as long. Its own
-- list "<signal>:<token>" is emptied (see register_in.lua).
local function register_ready(signal, handoff, token, member, stay, now)
  list('DEL', signal .. ':' .. token)
  redis.call('ZADD', handoff, whole(now + tonumber(stay)), member)
  redis.call('PEXPIRE', handoff, stay)
end
