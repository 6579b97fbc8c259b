-- SPDX-License-Identifier: MIT
-- list(command, name, ...): the command on a waiter's own wake-up list,
-- whose name has the waiter's token and so is not in KEYS (it has the
-- lock's hash tag: its slot is the lock's). While a cluster slot moves,
-- Redis refuses a name that is not on this node ("non local key") inside
-- a script; list answers nil, true then, else the command's reply.
local function list(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then return nil, true end
  return r
end
