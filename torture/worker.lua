-- SPDX-License-Identifier: MIT
-- A plain torture worker (Lua 5.4 or LuaJIT): runs sections
-- (torture/section.lua) one after the other until its deadline, and ends its
-- log with a DONE line. With TORTURE_BREAK=1 it takes no lock at all (the
-- section's fence is an INCR): a control run, in which the checker must find
-- silent overlaps.
-- usage: worker.lua <lock> <register_port> <id> <keys> <seconds> <ttl> <seed> <log>
local redislock = require("redislock")
local core = require("redislock.core")
local section = require("torture.section")

local where, reg_port, id = arg[1], tonumber(arg[2]), arg[3]
local nkeys, seconds, ttl, seed, logfile = tonumber(arg[4]), tonumber(arg[5]), tonumber(arg[6]),
                                           tonumber(arg[7]), arg[8]

math.randomseed(seed)
-- <lock>: see section.client_opts. TORTURE_TLS_CA: the lock server speaks
-- TLS only (verified as localhost).
local client = redislock.new(section.client_opts(where, os.getenv("TORTURE_TLS_CA")))
-- The register: a client of its own (never faulted).
local register = redislock.new{ port = reg_port, timeout = 5 }
local log = assert(io.open(logfile, "w"))
log:setvbuf("line")
local function write(line) log:write(line) end

-- The control run's stand-in for with_lock: no lock (a lock object for a
-- token nobody set), a fence all the same.
local with_lock = client.with_lock
if os.getenv("TORTURE_BREAK") == "1" then
  with_lock = function(_, key, _, fn)
    local lock = client:from_token(key, string.rep("0", 32))
    lock.fence = assert(register:command("INCR", "nolock:" .. key))
    return fn(lock)
  end
end

local deadline = core.now() + seconds
while core.now() < deadline do
  section.run(section.pick(nkeys, ttl, where), id, ttl, with_lock, client, register, core.sleep, write)
end
log:write("DONE\n")
log:close()
client:close()
register:close()
