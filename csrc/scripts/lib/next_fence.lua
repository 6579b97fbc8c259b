-- SPDX-License-Identifier: MIT
--! include add_fence fence_id
-- next_fence(rec) -> the next fence of the slot whose fence record is rec
-- (README.md, "Fences"): the number the record's new entry ID stands for.
-- Redis makes that ID "<ms>-<seq>" from its clock (TIME): the ms, or the
-- last entry's when the clock is behind it, and seq counting the entries
-- of that ms. So a fence is at least the server's clock in ms since
-- RL_FENCE_EPOCH_MS times RL_FENCE_SCALE, and above every fence the record
-- saw. A seq of RL_FENCE_SCALE or more (as many fences in one ms) is
-- carried into the ms: an entry with the fence's own ID follows, so that
-- the next IDs stand for larger numbers. The take (rl_proto.c) adds the
-- same entry in its transaction, and leaves such a seq to this script. A
-- clock before the epoch (a server that never set its clock) tells no
-- fence: the script fails, saying so.
local function next_fence(rec)
  local ms, seq = string.match(add_fence(rec, '*'), '^(%d+)%-(%d+)$')
  ms, seq = tonumber(ms), tonumber(seq)
  if ms < RL_FENCE_EPOCH_MS then
    return error("redislock: the server's clock reads before 2025 (" .. ms .. " ms since 1970): "
                 .. "fences follow it, so no lock can be granted until it is set")
  end
  local f = (ms - RL_FENCE_EPOCH_MS) * RL_FENCE_SCALE + seq
  if seq >= RL_FENCE_SCALE then add_fence(rec, fence_id(f)) end
  return f
end
