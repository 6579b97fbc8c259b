-- SPDX-License-Identifier: MIT
--! include stale
-- writer_try(readers, writer, writers, signal, token, ttl, now) -> v, s,
-- took: the head of a writer's try (write_acquire, write_acquire_wait):
-- readers and waiting writers past their deadlines dropped; v, the writer
-- key's token (false once a stale handoff was taken back; s: stale's
-- answer; signal: the waiters' lists); took when the key, free of writers
-- and readers or ours already, is now ours with ttl, and the token left
-- the waiting writers.
local function writer_try(readers, writer, writers, signal, token, ttl, now)
  redis.call('ZREMRANGEBYSCORE', readers, '-inf', now)
  redis.call('ZREMRANGEBYSCORE', writers, '-inf', now)
  local v = redis.call('GET', writer)
  local s = v and v ~= token and stale(writer, signal, v)
  if s == 0 then v = false end
  if v == token or (not v and redis.call('ZCARD', readers) == 0) then
    redis.call('SET', writer, token, 'PX', ttl)
    redis.call('ZREM', writers, token)
    return v, s, true
  end
  return v, s, false
end
