-- SPDX-License-Identifier: MIT
-- Guarded writes (redislock/guard.lua).
--
-- write(k, a): the write ARGV[a] ("set", "hset", "incrby", "del", "rpush")
-- on KEYS[k] (del: KEYS[k] and after) with ARGV[a + 1] and after as its
-- arguments (set: the value, then the TTL in ms or nothing); returns the
-- write's reply (set: 1).
local function write(k, a)
  local w = ARGV[a]
  if w == 'set' then
    if ARGV[a + 2] then redis.call('SET', KEYS[k], ARGV[a + 1], 'PX', ARGV[a + 2])
    else redis.call('SET', KEYS[k], ARGV[a + 1]) end
    return 1
  elseif w == 'hset' then return redis.call('HSET', KEYS[k], unpack(ARGV, a + 1))
  elseif w == 'incrby' then return redis.call('INCRBY', KEYS[k], ARGV[a + 1])
  elseif w == 'del' then return redis.call('DEL', unpack(KEYS, k))
  elseif w == 'rpush' then return redis.call('RPUSH', KEYS[k], unpack(ARGV, a + 1))
  end
  error('redislock: no write ' .. tostring(w))
end
