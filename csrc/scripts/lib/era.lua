-- SPDX-License-Identifier: MIT
--! include server_time whole
-- era(rec[, trust]) -> offset, id: the fence offset of this master's era in
-- the slot whose era record is rec (README.md, "Fences across failovers"),
-- starting a new era there when the record names another master; id is
-- this master's replication ID (nil when trust answered). INFO is read once
-- a script, and not at all when the record names trust (the ID the
-- script's connection vouches for as this master's, as a take's does).
local era_info
local function era(rec, trust)
  local r = redis.call('GET', rec)
  local off = r and tonumber(string.match(r, ' (%d+)$')) or 0
  if trust and r and string.sub(r, 1, #trust + 1) == trust .. ' ' then return off end
  era_info = era_info or redis.call('INFO', 'replication')
  local id = string.match(era_info, 'master_replid:(%x+)')
  if not id then error('redislock: INFO replication names no master_replid') end
  if r and string.sub(r, 1, #id + 1) == id .. ' ' then return off, id end
  local promoted = not string.find(era_info, 'master_replid2:' .. string.rep('0', 40), 1, true)
  if r or promoted then
    local lead = promoted and RL_ERA_LEAD or 0
    off = math.max(off + RL_ERA_STEP, server_time() + lead)
  end
  redis.call('SET', rec, id .. ' ' .. whole(off))
  return off, id
end
