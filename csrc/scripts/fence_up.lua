-- SPDX-License-Identifier: MIT
--! op fence_up keys=lock,fence,era flags=ms
-- fence_up: KEYS lock, fence (its holder's), era (the slot's fence
-- record); ARGV[1] token, ARGV[2] a fence (Redlock's second phase: the
-- majority's highest). Only while the lock holds our token (a holder whose
-- lock expired must not push a stale fence past a newer holder's), the
-- record is raised to it, so that this server's next fences are above it,
-- and it becomes the holder's fence. Replies as release: 1 (ours, done), 0,
-- or -2 - PTTL.
--! include add_fence fence_id whole
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  local want = tonumber(ARGV[2])
  add_fence(KEYS[3], fence_id(want)) -- refused when the record is there already
  local left = redis.call('PTTL', KEYS[1])
  if left > 0 then redis.call('SET', KEYS[2], whole(want), 'PX', left) end
  return 1
end
if v then return -2 - redis.call('PTTL', KEYS[1]) end
return 0
