-- SPDX-License-Identifier: MIT
-- A torture worker: loops on with_lock over a few keys until its deadline,
-- in a wait mode picked per section (notify, poll, fair), with short sections
-- and long ones (past the TTL: renewal keeps them). Inside each section it
-- does a read-modify-write of the key's counter and a fenced write, both on
-- the register server (never faulted), and it logs entry and exit, one line
-- each, on the monotonic clock that every process shares:
--   E <now> <key> <fence> <mode> <lifetime of the lock server>
--   X <now> <key> <fence> <outcome>     outcome: ok | lost | stale | <code>
--   F <now> <key> <code> <waited> <wait> <message>   a with_lock that failed
--                                        before fn ran (busy, connection ...)
-- "stale": the register refused the fence (a newer holder wrote first).
-- Entry and exit also go to the register's list history:<key> ("in <id>
-- <fence> <lifetime>", "out <id> <fence> <lifetime>"): the register's own
-- order, for a check that needs no clock.
-- With TORTURE_BREAK=1 it takes no lock at all (the section's fence is an
-- INCR): a control run, in which the checker must find silent overlaps.
-- usage: worker.lua <lock_port> <register_port> <id> <keys> <seconds> <ttl> <seed> <log>
local redislock = require "redislock"
local core = require "redislock.core"

local lock_port, reg_port, id = tonumber(arg[1]), tonumber(arg[2]), arg[3]
local nkeys, seconds, ttl, seed, logfile = tonumber(arg[4]), tonumber(arg[5]), tonumber(arg[6]),
                                           tonumber(arg[7]), arg[8]

math.randomseed(seed)
local client = redislock.new{ port = lock_port, timeout = 0.5, connect_timeout = 0.5 }
-- The register: a plain core client (its own connection, never faulted).
local register = core.new{ port = reg_port, timeout = 5 }
local log = assert(io.open(logfile, "w"))
log:setvbuf("line")

-- Accepts fence ARGV[1] for a key (KEYS[1]) only when it is higher than
-- every fence accepted before for it in the same lifetime of the lock server
-- (ARGV[2]: a restart without data starts the fences again, and the injector
-- counts lifetimes in the register's "lifetime" key, read when the section
-- begins).
local FENCED = [[
if tonumber(ARGV[1]) <= tonumber(redis.call('GET', KEYS[1]) or '0') then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1
]]

local MODES = { "notify", "poll", "fair" }
local deadline = core.now() + seconds

-- The control run's stand-in for with_lock: no lock, a fence all the same.
local with_lock = client.with_lock
if os.getenv("TORTURE_BREAK") == "1" then
  with_lock = function(_, key, _, fn)
    return fn({ fence = assert(register:command("INCR", "nolock:" .. key)) })
  end
end

while core.now() < deadline do
  local key = "k" .. math.random(nkeys)
  local mode = MODES[math.random(#MODES)]
  -- One section in five outlasts the TTL (1.5 to 3 TTLs): renewal keeps it.
  local hold = math.random(5) == 1 and ttl * (1.5 + 1.5 * math.random()) or 0.002 * math.random(10)
  local wait = 0.5 + 2 * math.random()
  local started = core.now()
  local entered = false
  local ok, err = pcall(with_lock, client, key, ttl, function(lock)
    entered = true
    local life = register:command("GET", "lifetime") or "0"
    local event = id .. " " .. lock.fence .. " " .. life
    register:command("RPUSH", "history:" .. key, "in " .. event)
    log:write(string.format("E %.6f %s %d %s %s\n", core.now(), key, lock.fence, mode, life))
    local n = tonumber(register:command("GET", "count:" .. key)) or 0
    core.sleep(hold)
    register:command("SET", "count:" .. key, n + 1)
    local accepted = register:command("EVAL", FENCED, 1, "fence:" .. key .. ":" .. life, lock.fence)
    register:command("RPUSH", "history:" .. key, "out " .. event)
    log:write(string.format("X %.6f %s %d %s\n", core.now(), key, lock.fence, accepted == 1 and "ok" or "stale"))
  end, { wait = wait, wait_mode = mode == "fair" and "notify" or mode, fair = mode == "fair" })
  if not ok then
    local msg = tostring(err)
    local code = msg:match("^(%a+):") or "uncoded"
    if entered then
      -- fn ran: the section's X line says what fn saw; this is how it ended.
      log:write(string.format("L %.6f %s %s %s\n", core.now(), key, code, (msg:gsub("\n", " "))))
    else
      log:write(string.format("F %.6f %s %s %.3f %.3f %s\n", core.now(), key, code, core.now() - started, wait,
                              (msg:gsub("\n", " "))))
    end
  end
end
log:write("DONE\n")
log:close()
client:close()
register:close()
