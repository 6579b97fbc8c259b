-- SPDX-License-Identifier: MIT
-- Worker for spec/33: takes a lock (no renewal), writes its PID to
-- <dir>/pid (for the spec's SIGSTOP), waits until <dir>/go exists (the spec
-- stops it past the lock's TTL meanwhile, lets a successor write, resumes
-- it), then writes "old" to the resource key through a guard of the lock:
-- fenced to the lock's own client, fenced to the resource's client, or
-- owned; or (sql) UPDATEs the row of id <resource key> in the table
-- "reports" of the PostgreSQL server on port <resource where>, fenced
-- (redislock.sql, over LuaSQL). Prints "fence <n>", then "written" or
-- "refused <message>".
-- usage: guarded_writer.lua <where> <key> <ttl> <fenced|fenced-other|owned|sql> <resource where> <resource key> <dir>
local redislock = require("redislock")
local core = require("redislock.core")

local connect = require("spec.workers.connect")

local key, ttl, form, rkey, dir = arg[2], tonumber(arg[3]), arg[4], arg[6], arg[7]
local client = redislock.new(connect(arg[1]))
local lock = assert(client:acquire(key, ttl, { wait = 5, renew = false }))
print("fence " .. lock.fence)
io.stdout:flush()
local stat = assert(io.open("/proc/self/stat")):read("*l")
local f = assert(io.open(dir .. "/pid.tmp", "w"))
f:write(stat:match("^%d+"))
f:close()
assert(os.rename(dir .. "/pid.tmp", dir .. "/pid"))
while not io.open(dir .. "/go") do core.sleep(0.01) end
if form == "sql" then
  local sql = require("redislock.sql")
  local env = require("luasql.postgres").postgres()
  local conn = assert(env:connect("postgres", "nobody", nil, "127.0.0.1", tonumber(arg[5])))
  local text, params = sql.update(lock, "reports", { body = "old" }, { id = tonumber(rkey) })
  local n = assert(conn:execute(sql.inline(text, params, function(v) return conn:escape(v) end)))
  print(n >= 1 and "written" or "refused (no row changed)")
  conn:close()
  env:close()
  os.exit(0)
end
local guard
if form == "owned" then
  guard = lock:owned()
elseif form == "fenced-other" then
  guard = lock:fenced(redislock.new(connect(arg[5])))
else
  guard = lock:fenced()
end
local ok, err = guard:set(rkey, "old")
print(ok and "written" or "refused " .. tostring(err))
