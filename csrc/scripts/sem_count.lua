-- SPDX-License-Identifier: MIT
--! op sem_count keys=permits
-- sem_count: KEYS permits. Replies {1, permits held now}.
--! include server_time
local now = server_time()
return {1, redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')}
