-- SPDX-License-Identifier: MIT
-- A lock server's clock jumped forward, as far as its locks can tell (make
-- torture's single and Redlock phases): the TTLs of every lock:{k...} name
-- cut by the jump, those shorter than it deleted, in one script, so that
-- they expire early. Redis expires keys by its wall clock, so a jump of
-- its clock does that (Kleppmann's case against Redlock). The clock itself
-- stays: libfaketime, which could move it, cannot run Debian's
-- redis-server, whose jemalloc recurses into clock_gettime under it.
local core = require("redislock.core")

local _M = {}

--- Jumps srv's clock (a helpers Server) 1 to 4 s forward; records in
-- windows the span (on the monotonic clock) in which a lock may end early:
-- from now to a TTL after. Returns a line for the log.
function _M.jump(srv, ttl, windows)
  local jump = math.floor(1000 + 3000 * math.random())
  local now = core.now()
  srv:cli("EVAL", "for _, k in ipairs(redis.call('KEYS', ARGV[2])) do "
    .. "local p = redis.call('PTTL', k) "
    .. "if p > 0 and p <= tonumber(ARGV[1]) then redis.call('DEL', k) "
    .. "elseif p > 0 then redis.call('PEXPIRE', k, p - tonumber(ARGV[1])) end end", "0", tostring(jump),
    "lock:{k*}")
  windows[#windows + 1] = { now, now + ttl + 0.5 }
  return string.format("server :%d's clock jumped %d ms forward (its locks' TTLs cut by that)", srv.port, jump)
end

return _M
