-- SPDX-License-Identifier: MIT
--- redislock.admin: what operators ask of a lock and do to it:
-- client:inspect(key) (held? time left, fence, who holds it) and
-- client:force_release(key). Each is one script on the lock's server (or
-- its slot's node), from the C core (csrc/scripts/). Who holds a lock comes
-- from its token, which carries it at no cost (hold.lua's new_token):
-- 32 random hex digits, then /<host>/<pid>/<since>[/<label>].

local args = require("redislock.args")
local core = require("redislock.core")

local tonumber = tonumber

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

--- Who holds a lock, read from its token: { host, pid, since (unix seconds),
-- label (or nil) }, or nil for a token without it (holder = false, or
-- another client's).
function _M.holder_of(tok)
  local host, pid, since, rest = tok:match("^%x+/([^/]*)/(%d+)/(%d+)(.*)$")
  if not host then return nil end
  -- An election's token goes on with " <value>" (redislock/election.lua).
  return { host = host, pid = tonumber(pid), since = tonumber(since), label = rest:match("^/([^ ]+)") }
end


--- inspect(client, key) -> { held, ttl, fence, token, holder } | nil, err:
-- held (boolean); ttl (seconds left, nil when free or without expiry);
-- fence (its holder's, nil when the lock is free); token and holder
-- (see holder_of) when held.
function _M.inspect(client, key)
  local reply, err = client._transport:script("inspect", key)
  if reply == nil then return nil, err end
  local value, pttl, last = reply[1], reply[2], reply[3]
  local info = { held = value ~= false, fence = last and tonumber(last) or nil }
  if value then
    info.token, info.holder = value, _M.holder_of(value)
    if pttl >= 0 then info.ttl = pttl / 1000 end
  end
  return info
end

--- force_release(client, key) -> true (it was held) | false (it was free) | nil, err:
-- deletes the lock whoever holds it and wakes one waiter; the next
-- holder's fence is larger (the slot's fence record stays).
function _M.force_release(client, key)
  local reply, err = client._transport:script("force_release", key)
  if reply == nil then return nil, err end
  return reply == 1
end

return _M
