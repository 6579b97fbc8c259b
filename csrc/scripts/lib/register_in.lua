-- SPDX-License-Identifier: MIT
--! include list whole
-- A waiter that will block registers for a handoff (README.md, "Handing
-- over"). Its own list "<signal>:<token>" is emptied: the try found the
-- lock not its own, so a handoff left there is of a lock it no longer holds
-- (taken back, force-released, evicted), and must not be taken for one.
--
-- register_in(signal, queue, hand, token, hms, stay, now, t): a fair
-- waiter (or a waiting writer), for a handoff of hms ms: in the queue by
-- arrival (score: TIME t in us; kept when it is there already), and its
-- registration in hand, "<deadline> <hms>", which lasts stay ms.
local function register_in(signal, queue, hand, token, hms, stay, now, t)
  list('DEL', signal .. ':' .. token)
  redis.call('ZADD', queue, 'NX', t[1] .. string.format('%06d', t[2]), token)
  redis.call('HSET', hand, token, whole(now + tonumber(stay)) .. ' ' .. hms)
  redis.call('PEXPIRE', queue, stay)
  redis.call('PEXPIRE', hand, stay)
end
