-- SPDX-License-Identifier: MIT
-- id_fence(id) -> the number an entry ID "<ms>-<seq>" of the fence record
-- stands for: ms * RL_FENCE_SCALE + seq (a fence when seq is below
-- RL_FENCE_SCALE).
local function id_fence(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return tonumber(ms) * RL_FENCE_SCALE + tonumber(seq)
end
