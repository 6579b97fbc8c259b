-- SPDX-License-Identifier: MIT
--! include whole
-- fence_id(f) -> the fence record's entry ID "<ms>-<seq>" that stands for
-- fence f (f = (ms - RL_FENCE_EPOCH_MS) * RL_FENCE_SCALE + seq, seq below
-- RL_FENCE_SCALE).
local function fence_id(f)
  return whole(math.floor(f / RL_FENCE_SCALE) + RL_FENCE_EPOCH_MS) .. '-' .. whole(f % RL_FENCE_SCALE)
end
