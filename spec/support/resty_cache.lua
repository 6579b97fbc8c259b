-- SPDX-License-Identifier: MIT
-- A small cache written against lua-resty-lock, as lua-resty-mlcache's users
-- write one (and as mlcache does it inside): look in the worker's shared
-- dictionary; on a miss take the callback's lock, look again, run the
-- callback, store its value, unlock. spec/46 runs it in nginx with
-- redislock.resty_lock swapped in for resty.lock; nothing here knows.
local resty_lock = require("resty.lock")

local ngx = ngx
local pcall, tostring = pcall, tostring

local _M = {}

--- The value of key in the shared dictionary shm; on a miss, cb(key)'s,
-- stored for ttl seconds, computed under the lock on key in the locks
-- dictionary. Returns the value, or nil and an error, as mlcache's get.
function _M.get(shm, locks, key, ttl, cb)
  local dict = ngx.shared[shm]
  local value = dict:get(key)
  if value ~= nil then return value end

  local lock, err = resty_lock:new(locks, { exptime = 10, timeout = 5 })
  if not lock then return nil, "could not create lock: " .. err end
  local elapsed, lerr = lock:lock(key)
  if not elapsed then return nil, "could not acquire callback lock: " .. lerr end

  -- Another worker (or, now, another nginx) may have filled it meanwhile.
  value = dict:get(key)
  if value ~= nil then
    local ok, uerr = lock:unlock()
    if not ok and uerr ~= "unlocked" then return nil, "could not unlock callback: " .. uerr end
    return value
  end

  local ok, res = pcall(cb, key)
  if not ok then
    lock:unlock()
    return nil, "callback threw an error: " .. tostring(res)
  end
  dict:set(key, res, ttl)
  local unlocked, uerr = lock:unlock()
  if not unlocked and uerr ~= "unlocked" then return nil, "could not unlock callback: " .. uerr end
  return res
end

return _M
