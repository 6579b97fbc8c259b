-- SPDX-License-Identifier: MIT
--! op release_one keys=lock flags=once
--! op write_release_one keys=writer flags=once
-- release_one: KEYS lock (or a write hold's writer key); ARGV[1] token.
-- Release without the wake-up, whose keys may be missing on a node while
-- the slot moves (Redis answers TRYAGAIN to a script with some of its keys
-- missing then); waiters find the lock free by the bound of their wait.
-- Replies as release.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if v then return -2 - redis.call('PTTL', KEYS[1]) end
return 0
