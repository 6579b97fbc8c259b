-- SPDX-License-Identifier: MIT
--! op read_release_one keys=readers flags=once
--! op sem_release_one keys=permits flags=once
-- read_release_one, sem_release_one: KEYS readers (permits); ARGV[1]
-- token. A read hold's or a permit's release as release_one is a lock's:
-- its own key alone, waking nobody (a cluster slot half moved). Replies as
-- read_release.
--! include server_time
local now = server_time()
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(s) <= now then return 0 end
return 1
