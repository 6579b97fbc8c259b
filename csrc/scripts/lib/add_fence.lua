-- SPDX-License-Identifier: MIT
-- add_fence(rec, id) -> the ID of a new entry of the fence record rec (a
-- stream: README.md, "Fences"), id "*" (Redis makes it from its clock) or
-- one given, or nil when a given one is not above the record's last (which
-- a stream refuses). The stream keeps no entry (MAXLEN 0), only its last
-- ID. An era record of an earlier version (a string) is replaced: every
-- fence of that version is below the clock's.
local function add_fence(rec, id)
  local r = redis.pcall('XADD', rec, 'MAXLEN', 0, id, 'f', 1)
  if type(r) == 'table' and r.err then
    if redis.call('TYPE', rec)['ok'] ~= 'string' then
      if id ~= '*' and string.find(r.err, 'equal or smaller', 1, true) then return nil end
      return error(r)
    end
    redis.call('DEL', rec)
    r = redis.call('XADD', rec, 'MAXLEN', 0, id, 'f', 1)
  end
  return r
end
