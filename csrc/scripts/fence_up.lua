-- SPDX-License-Identifier: MIT
--! op fence_up keys=lock,fence,era flags=ms
-- fence_up: KEYS lock, fence, era; ARGV[1] token, ARGV[2] a fence (Redlock's
-- second phase). Only while the lock holds our token (a holder whose lock
-- expired must not push a stale fence past a newer holder's), the counter
-- is raised so that this server's fence (counter + its era's offset) is at
-- least ARGV[2]. Replies as release: 1 (ours, done), 0, or -2 - PTTL.
--! include era whole
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  local want = tonumber(ARGV[2]) - era(KEYS[3])
  if (tonumber(redis.call('GET', KEYS[2])) or 0) < want then
    redis.call('SET', KEYS[2], whole(want))
  end
  return 1
end
if v then return -2 - redis.call('PTTL', KEYS[1]) end
return 0
