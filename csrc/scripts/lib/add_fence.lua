-- SPDX-License-Identifier: MIT
-- add_fence(rec, id) -> the ID of a new entry of the fence record rec (a
-- stream: README.md, "Fences"), id "*" (Redis makes it from its clock) or
-- one given, or nil when a given one is not above the record's last (which
-- a stream refuses). The stream keeps no entry (MAXLEN 0), only its last
-- ID.
local function add_fence(rec, id)
  if id == '*' then return redis.call('XADD', rec, 'MAXLEN', 0, id, 'f', 1) end
  local r = redis.pcall('XADD', rec, 'MAXLEN', 0, id, 'f', 1)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'equal or smaller', 1, true) then return nil end
    return error(r)
  end
  return r
end
