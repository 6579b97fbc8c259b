-- SPDX-License-Identifier: MIT

--- redislock.guard: writes guarded by a hold (a lock, a semaphore's permit,
-- a read-write lock's write hold, a Redlock lock), so that a holder that was
-- paused past its TTL cannot overwrite its successor's work.
--
--   hold:fenced([client])  writes applied only when the hold's fence is at
--        least the highest fence the resource accepted (which it becomes):
--        to any server (client: a redislock client of one server,
--        Sentinel or a cluster; default the hold's own, unless Redlock's).
--        Each resource key's highest fence is kept beside it, in its hash
--        slot (fence_key below), and never expires.
--   hold:owned()           writes applied only while the hold is still ours
--        (etcd's IsOwner), on the hold's own server, atomically.
--
-- Both give a guard with set, hset, incr, del, rpush and eval (a script of
-- the user's, run under the guard). Each returns true and the write's reply;
-- or false and "stale: ..." (fenced: a later holder's write came first) or
-- "lost: ..." (owned: the hold is no longer ours, and reports itself lost;
-- either: the hold was released here, or found lost, and nothing was sent);
-- or nil and a "connection: ..." / "redis: ..." error. The checks and
-- writes are the C core's scripts (csrc/scripts/fenced_write.lua and owned_write.lua).

local args = require("redislock.args")
local core = require("redislock.core")
local hold_mod = require("redislock.hold")
local lock_mod = require("redislock.lock")

local ipairs, pairs, select, setmetatable, tostring, type = ipairs, pairs, select, setmetatable, tostring, type
local string_format = string.format
local unpack = table.unpack or unpack -- luacheck: ignore (LuaJIT's global)
local argerror, quote, show, number_text = args.argerror, args.quote, args.show, args.number_text
local connection_failed = require("redislock.errors").connection

-- Raises "bad self to 'fname' (msg)" at the caller.
local function bad_self(fname, msg)
  args.raise_at_caller(string_format("bad self to '%s' (%s)", fname, msg))
end

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

--- A guard: what hold:fenced() and hold:owned() return. Its writes are made
-- only while the hold's fence allows (fenced) or the hold is ours (owned).
-- @type Guard
local Guard = {}
local guard_mt = { __index = Guard }

-- The key of the highest fence a resource key accepted, in the key's own
-- hash slot: after a key with a hash tag, "<key>:fence" (same tag); else
-- "{<key>}:fence" (the whole key as the tag). nil for a key that has a '}'
-- but no tag, whose slot no such name shares.
function _M.fence_key(key)
  local open = key:find("{", 1, true)
  local close = open and key:find("}", open + 1, true)
  if close and close > open + 1 then return key .. ":fence" end
  if key:find("}", 1, true) then return nil end
  return "{" .. key .. "}:fence"
end
local fence_key = _M.fence_key

-- How an owned write finds the hold on the server: its key's suffix after
-- "<prefix>{<key>}", and how the token is kept there.
local OWNER = {
  lock = { "", "string" },
  leadership = { "", "string" }, -- an election's lock (redislock/election.lua)
  ["write lock"] = { ":rw:writer", "string" },
  permit = { ":permits", "zset" },
}

-- hold:fenced([client]) (see above); hold is a lock object (redislock/lock.lua).
function _M.fenced(hold, client)
  if type(hold.fence) ~= "number" then
    bad_self("fenced", "a hold with one fence expected; a lock made by from_token has none (its fence is not "
                       .. "known): guard with hold:owned(), or take the lock with acquire")
  end
  local t
  if client == nil then
    t = hold._t
    if t.quorum then
      argerror(1, "fenced", "a Redlock lock guards writes to a client of the resource's server: hold:fenced(client)")
    end
  elseif hold_mod.is_client(client) then
    if hold_mod.closed(client) then argerror(1, "fenced", "client is closed") end
    t = client._transport
    if t.quorum then
      argerror(1, "fenced", "the resource's client must reach one server, Sentinel's master or a cluster, "
                            .. "not Redlock's")
    end
  else
    argerror(1, "fenced", "client must be a redislock client, got " .. type(client))
  end
  return setmetatable({ hold = hold, t = t, owned = false, client = client }, guard_mt)
end

-- hold:owned() (see above).
function _M.owned(hold)
  local owner = OWNER[hold._ops.kind]
  if not owner then
    bad_self("owned", "a " .. hold._ops.kind .. " does not own writes; owner-checked writes go with a lock, a "
                      .. "write lock, a permit or a leadership")
  end
  if hold._t.quorum then
    bad_self("owned", "a Redlock lock lives on several servers; guard its writes with hold:fenced(client)")
  end
  local owner_key = hold._link.prefix .. "{" .. hold.key .. "}" .. owner[1]
  return setmetatable({ hold = hold, t = hold._t, owned = true, owner_key = owner_key, how = owner[2] }, guard_mt)
end

-- Raises unless key is a key name (argument n of fname).
local function check_key(n, fname, key)
  if type(key) ~= "string" or key == "" then
    argerror(n, fname, "key must be a non-empty string, got " .. (type(key) == "string" and '""' or type(key)))
  end
end


-- A value to write: a string, or a finite number.
local function value_of(n, fname, v)
  if type(v) == "string" then return v end
  if type(v) == "number" and v == v and v ~= 1 / 0 and v ~= -1 / 0 then return number_text(v) end
  argerror(n, fname, "value must be a string or a finite number, got " .. show(v))
end

-- An error message about a user's script (script) run in the guard's
-- text (text: a guard's head, the script, its tail (csrc/scripts/guard_*.lua)) with the server's
-- line numbers (user_script:N) turned into the script's own; a line of the
-- guard's head or tail keeps its number.
local function user_lines(msg, text, script)
  local at = text:find(script, 1, true)
  if not at then return msg end
  local _, offset = text:sub(1, at - 1):gsub("\n", "")
  local _, inside = script:gsub("\n", "")
  return (msg:gsub("user_script:(%d+)", function(n)
    n = tonumber(n)
    if n > offset and n <= offset + inside + 1 then return "user_script:" .. (n - offset) end
  end))
end

-- Sends the write (keys: the resource keys, argument nk of fname; argv:
-- the write and its arguments; script: a user's script text, for eval)
-- under the guard.
local function guarded(self, fname, nk, keys, argv, script)
  local hold, t = self.hold, self.t
  args.check_phase(t, fname)
  -- A hold released here or found lost sends nothing; a closed client's
  -- hold can still fence writes to another client.
  -- The resource's own client (fenced(client)) closed since: refused as a
  -- closed client's methods are.
  if self.client and hold_mod.closed(self.client) then
    bad_self(fname, "the guard's client is closed")
  end
  local gone = lock_mod.no_longer_ours(hold) or (t == hold._t and lock_mod.unusable(hold))
  if gone then
    if connection_failed(gone) then return nil, gone end
    return false, gone
  end
  local first, head
  if self.owned then
    first, head = self.owner_key, { hold.token, self.how }
  else
    first = fence_key(keys[1])
    if not first then
      argerror(nk, fname, quote(keys[1]) .. " has a '}' but no hash tag: its fence record cannot share its slot; "
                         .. "give it a hash tag ({...})")
    end
    head = { number_text(hold.fence) }
  end
  -- In a cluster every key must be in the slot of the first (the owner's
  -- key, or the fence record): one node runs the script.
  if t.spread then
    local slot = core.slot(first)
    for _, k in ipairs(keys) do
      if core.slot(k) ~= slot then
        argerror(nk, fname, string_format("%s is in hash slot %d, not %d (%s): give it the same hash tag",
                                         quote(k), core.slot(k), slot,
                                         self.owned and "the lock's" or "the first key's"))
      end
    end
  end
  local names, words = { first }, {}
  for i = 1, #keys do names[#names + 1] = keys[i] end
  for i = 1, #head do words[#words + 1] = head[i] end
  for i = 1, #argv do words[#words + 1] = argv[i] end
  local op = self.owned and "owned_write" or "fenced_write"
  if script then
    local text, sha = core.guard_script(self.owned, script)
    op = { sha = sha, text = text }
  end
  local reply, err = t:script(op, names, unpack(words))
  if reply == nil then return nil, script and user_lines(err, op.text, script) or err end
  if reply[1] == 1 then
    local v = reply[2]
    -- A user's script that answered an error (redis.error_reply, or a
    -- redis.pcall's error passed on) failed: the error is its reply.
    if script and type(v) == "table" and type(v.err) == "string" then
      return nil, "redis: " .. user_lines(v.err, op.text, script)
    end
    return true, v
  end
  if self.owned then return false, lock_mod.set_lost(hold, "found by an owner-checked write") end
  return false, string_format("stale: %s accepted fence %s already; this %s's is %s", quote(keys[1]),
                              tostring(reply[2]), hold._ops.kind, number_text(hold.fence))
end

-- How many entries t has (a list has #t).
local function count(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n
end

local function check_guard(self, fname)
  args.check_self(self, guard_mt, fname, "redislock guard")
end

--- guard:set(key, value[, ttl]): SET key value (PX ttl, in seconds).
-- @string key the key written
-- @tparam string|number value its value
-- @number[opt] ttl seconds until the key expires
-- @treturn boolean true, the write was made
-- @return the reply (1)
-- @return[2] false
-- @treturn[2] string "stale: ..." (fenced) or "lost: ..." (owned, or the hold released)
-- @return[3] nil
-- @treturn[3] string "connection: ..." or "redis: ..."
function Guard:set(key, value, ttl, ...)
  check_guard(self, "set")
  check_key(1, "set", key)
  local argv = { "set", value_of(2, "set", value) }
  if ttl ~= nil then argv[3] = show(args.check_seconds(3, "set", "ttl", ttl)) end
  args.check_nargs("set", 3, ...)
  return guarded(self, "set", 1, { key }, argv)
end

--- guard:hset(key, field, value[, field, value ...]): HSET; the reply is
-- how many fields were new.
-- @string key the hash
-- @param ... field, value[, field, value ...]: strings or numbers
-- @treturn boolean true, the write was made
-- @return how many fields were new
-- @return[2] false
-- @treturn[2] string "stale: ..." (fenced) or "lost: ..." (owned, or the hold released)
-- @return[3] nil
-- @treturn[3] string "connection: ..." or "redis: ..."
function Guard:hset(key, ...)
  check_guard(self, "hset")
  check_key(1, "hset", key)
  local n = select("#", ...)
  if n == 0 or n % 2 == 1 then argerror(2, "hset", "fields and values expected in pairs, got " .. n .. " values") end
  local argv = { "hset" }
  for i = 1, n do argv[i + 1] = value_of(i + 1, "hset", (select(i, ...))) end
  return guarded(self, "hset", 1, { key }, argv)
end

--- guard:incr(key[, by]): INCRBY key by (1); the reply is the new value.
-- @string key the counter
-- @int[opt=1] by the increment (a whole number; may be negative)
-- @treturn boolean true, the write was made
-- @return the new value
-- @return[2] false
-- @treturn[2] string "stale: ..." (fenced) or "lost: ..." (owned, or the hold released)
-- @return[3] nil
-- @treturn[3] string "connection: ..." or "redis: ..."
function Guard:incr(key, by, ...)
  check_guard(self, "incr")
  check_key(1, "incr", key)
  if by == nil then by = 1 end
  if not args.is_whole(by, -2 ^ 53, 2 ^ 53) then
    argerror(2, "incr", "by must be a whole number, got " .. show(by))
  end
  args.check_nargs("incr", 2, ...)
  return guarded(self, "incr", 1, { key }, { "incrby", number_text(by) })
end

--- guard:del(key[, key ...]): DEL; the reply is how many keys were deleted.
-- The fence is the first key's.
-- @string key a key
-- @param ... more keys
-- @treturn boolean true, the write was made
-- @return how many keys were deleted
-- @return[2] false
-- @treturn[2] string "stale: ..." (fenced) or "lost: ..." (owned, or the hold released)
-- @return[3] nil
-- @treturn[3] string "connection: ..." or "redis: ..."
function Guard:del(key, ...)
  check_guard(self, "del")
  if key == nil then argerror(1, "del", "a key expected") end
  local keys = { key, ... }
  for i = 1, select("#", ...) + 1 do check_key(i, "del", keys[i]) end
  return guarded(self, "del", 1, keys, { "del" })
end

--- guard:rpush(key, value[, value ...]): RPUSH; the reply is the list's length.
-- @string key the list
-- @param ... the values (one at least): strings or numbers
-- @treturn boolean true, the write was made
-- @return the list's length
-- @return[2] false
-- @treturn[2] string "stale: ..." (fenced) or "lost: ..." (owned, or the hold released)
-- @return[3] nil
-- @treturn[3] string "connection: ..." or "redis: ..."
function Guard:rpush(key, ...)
  check_guard(self, "rpush")
  check_key(1, "rpush", key)
  local n = select("#", ...)
  if n == 0 then argerror(2, "rpush", "a value expected") end
  local argv = { "rpush" }
  for i = 1, n do argv[i + 1] = value_of(i + 1, "rpush", (select(i, ...))) end
  return guarded(self, "rpush", 1, { key }, argv)
end

--- guard:eval(script, keys[, args]): runs script (Lua, as for EVAL: it sees
-- its own KEYS and ARGV) under the guard; the fence is the first key's.
-- The reply is the script's.
-- @string script the script's Lua source
-- @tparam {string,...} keys its KEYS (one at least)
-- @tparam[opt] {string|number,...} argv its ARGV
-- @treturn boolean true, the write was made
-- @return the script's reply
-- @return[2] false
-- @treturn[2] string "stale: ..." (fenced) or "lost: ..." (owned, or the hold released)
-- @return[3] nil
-- @treturn[3] string "connection: ..." or "redis: ..."
function Guard:eval(script, keys, argv, ...)
  check_guard(self, "eval")
  if type(script) ~= "string" or script == "" then
    argerror(1, "eval", "script must be a non-empty string, got " .. show(script))
  end
  if type(keys) ~= "table" or #keys == 0 or count(keys) ~= #keys then
    argerror(2, "eval", "keys must be a list of at least one key")
  end
  for i = 1, #keys do check_key(2, "eval", keys[i]) end
  local list = {}
  if argv ~= nil then
    if type(argv) ~= "table" or count(argv) ~= #argv then argerror(3, "eval", "args must be a list") end
    for i = 1, #argv do list[i] = value_of(3, "eval", argv[i]) end
  end
  args.check_nargs("eval", 3, ...)
  return guarded(self, "eval", 2, keys, list, script)
end

--- Writes guarded by this hold's fence, to client (a redislock client;
-- default: the hold's own): a method of lock objects (redislock/lock.lua).
-- No I/O.
-- @function Lock:fenced
-- @tparam[opt] Client client where the resource is (any redislock client of
--   one server, Sentinel or a cluster); a Redlock lock needs one
-- @treturn Guard the guard (set, hset, incr, del, rpush, eval)
function lock_mod.Lock:fenced(client, ...)
  args.check_self(self, lock_mod.lock_mt, "fenced", "redislock lock")
  args.check_nargs("fenced", 1, ...)
  return _M.fenced(self, client)
end

--- Writes applied only while this hold is still ours, on its own server: a
-- method of lock objects. No I/O.
-- @function Lock:owned
-- @treturn Guard the guard (set, hset, incr, del, rpush, eval)
function lock_mod.Lock:owned(...)
  args.check_self(self, lock_mod.lock_mt, "owned", "redislock lock")
  args.check_nargs("owned", 0, ...)
  return _M.owned(self)
end

guard_mt.__tostring = function(self)
  return string_format("redislock guard (%s) of %s", self.owned and "owned" or "fenced", tostring(self.hold))
end

return _M
