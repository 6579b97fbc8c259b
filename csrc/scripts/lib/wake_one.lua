-- SPDX-License-Identifier: MIT
--! include list
-- Waking waiters that try again (README.md, "Waking").
--
-- wake_one(signal[, heir]): wakes one waiter with "1": heir's own list
-- "<signal>:<heir>", or the shared one, signal, when heir is nil.
local function wake_one(signal, heir)
  local sig = heir and (signal .. ':' .. heir) or signal
  list('DEL', sig)
  list('RPUSH', sig, 1)
  list('PEXPIRE', sig, RL_SIGNAL_MS)
end
