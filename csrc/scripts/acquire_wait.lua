-- SPDX-License-Identifier: MIT
--! op acquire_wait keys=lock,fence,handoff,era flags=ms,n,stay
-- acquire_wait: KEYS lock, fence, handoff, era; ARGV[1] token, ARGV[2] ttl
-- (ms), ARGV[3] the TTL a handoff gives it (ms: the ttl, or less for a
-- waiter whose renewal extends it at once), ARGV[4] how long its
-- registration lasts (ms). A waiter's try (mode "notify"): acquire's, which
-- registers the waiter for a handoff when the lock is held
-- (register_ready, README.md "Handing over"), and drops its registration
-- when it takes the lock. Replies as acquire. The first step takes the
-- lock or reads its holder: SET NX GET (Redis 7), or SET NX then GET where
-- that is refused (Redis 6: one call more, and a refused one in INFO
-- errorstats).
--! include grant list ready_member register_ready server_time stale
local member = ready_member(ARGV[3], ARGV[1])

local function taken()
  redis.call('ZREM', KEYS[3], member)
  return grant(KEYS[2], KEYS[4], ARGV[2])
end

local function take()
  return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
end

local v = redis.pcall('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if type(v) == 'table' and v.err then v = not take() and redis.call('GET', KEYS[1]) end
if not v then return taken() end
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  list('DEL', KEYS[1] .. ':signal:' .. ARGV[1])
  return taken()
end
local signal = KEYS[1] .. ':signal'
local left = redis.call('PTTL', KEYS[1])
local s = stale(KEYS[1], signal, v)
if s == 0 and take() then return taken() end
if s and s > 0 and s < left then left = s end
register_ready(signal, KEYS[3], ARGV[1], member, ARGV[4], server_time())
return -2 - left
