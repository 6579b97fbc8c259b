-- SPDX-License-Identifier: MIT
-- A short tour of the redislock API, one step per line of output: a client,
-- acquire / busy / release, fence, ttl and extend, expiry, with_lock (its
-- return values, its errors) and, on Lua 5.4, `local lock <close>`.
--
-- Run by hand (needs a redis-server; REDIS_URL, else 127.0.0.1:6379):
--  REDIS_URL=redis://127.0.0.1:6379 LUA_PATH="lua/?.lua;;" LUA_CPATH="build/lua5.4/?.so;;" lua5.4 examples/basic.lua
-- It uses locks whose names start with "basic:".

local redislock = require("redislock")
local core = require("redislock.core")  -- only for core.sleep, to let a lock expire

local function say(fmt, ...)
  print(string.format(fmt, ...))
end

-- No I/O yet: the client connects on its first call.
local url = os.getenv("REDIS_URL")
local client = redislock.new{ url = (url and url ~= "") and url or "redis://127.0.0.1:6379" }
say("client:     %s", tostring(client))

-- acquire tries once (wait = 0) and returns the lock, or nil and an error
-- whose first word is a stable code: busy, lost, connection, redis.
local lock = assert(client:acquire("basic:report", 5))
say("acquire:    %s, token %s...", tostring(lock), lock.token:sub(1, 8))

local other, err = client:acquire("basic:report", 5)
say("again:      %s, %s", tostring(other), err)

-- The lock's remaining time, and extend, which sets it (not adds to it).
say("ttl:        %.1f s", assert(lock:ttl()))
assert(lock:extend(10))
say("extend(10): ttl now %.1f s", assert(lock:ttl()))

-- Release compares the token on the server: only the owner deletes the lock.
-- Releasing twice is harmless; other calls on a released lock say "lost".
say("release:    %s, and again: %s", tostring(lock:release()), tostring(lock:release()))
say("ttl:        %s, %s", lock:ttl())

-- The fence grows with every acquisition of the same name, never goes back:
-- pass it to whatever the lock protects, so that it can refuse a stale writer.
local again = assert(client:acquire("basic:report", 5))
say("fence:      %d, then %d", lock.fence, again.fence)
assert(again:release())

-- A lock that outlives its ttl is gone; its owner learns it on the next call.
local short = assert(client:acquire("basic:short", 0.05))
core.sleep(0.1)
say("expired:    %s, %s", short:release())

-- with_lock takes the lock, calls fn(lock), releases, and returns fn's values;
-- wait = 2 keeps trying for up to 2 s while another owner holds it.
local total, unit = client:with_lock("basic:report", 5, function(l)
  return 42, "rows (fence " .. l.fence .. ")"
end, { wait = 2 })
say("with_lock:  returned %d, %s", total, unit)

-- When fn raises, with_lock releases the lock, then raises fn's error value
-- unchanged (a table stays a table).
local ok, e = pcall(client.with_lock, client, "basic:report", 5, function()
  error({ code = "E_STALE", detail = "the ledger moved" })
end)
local free = client:acquire("basic:report", 5)
say("fn raised:  ok=%s, error code %s; lock released: %s", tostring(ok), e.code, tostring(free ~= nil))
if free then free:release() end

-- Bad arguments raise at once, pointing at the caller's line.
local _, arg_err = pcall(function() client:acquire("basic:report", 0) end)
say("bad ttl:    %s", arg_err)

-- Lua 5.4 to-be-closed variable: released when the block is left, by any way.
-- Compiled with load() so that LuaJIT and Lua 5.1 can still run this file.
if _VERSION >= "Lua 5.4" then
  local scoped = assert(load([[
    local client, say = ...
    local lock_ref
    do
      local lock <close> = assert(client:acquire("basic:scoped", 5))
      lock_ref = lock
      say("<close>:    inside the block, %s", tostring(lock))
    end
    say("<close>:    after the block, %s", tostring(lock_ref))
  ]], "=basic.lua <close> part"))
  scoped(client, say)
else
  say("<close>:    skipped (needs Lua 5.4, this is %s)", jit and jit.version or _VERSION)
end

client:close()
