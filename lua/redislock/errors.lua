-- SPDX-License-Identifier: MIT
--- redislock.errors: what an error message lets the code that met it do.
-- A message's class is decided once, by the C core beside its reply decoder
-- (core.error_class; what each class means: csrc/rl_proto.h's
-- rl_error_class), for both transports alike; the Lua layer decides by the
-- class, never by the sentence. Here is the one table of which classes each
-- retry loop may retry. Nothing here runs on a success.

local core = require("redislock.core")

local pairs = pairs

local class = core.error_class

local _M = { _VERSION = core._VERSION }

-- The classes, and the loops that may try again after them:
--   again    a release or extend sent again (redislock/backoff.lua's again,
--            Redlock's eval_until): the command did not run, for a state
--            that passes; an acquire refused so has nothing to give back
--   wait     a take tried again while its wait lasts (redislock/wait.lua,
--            resty_lock's first try): a lost connection too, as every lock
--            script checks its token, so a resend is reconciled
--   resolve  a topology asks where the master (Sentinel) or the slot's
--            node (Cluster) is before its next call
--   here     Cluster calls the slot's node again, within the client's timeout
--   resend   Sentinel makes the call again at once: nothing was sent
local RETRY = {
  transient = { again = true, wait = true },
  stale = { again = true, wait = true, resolve = true },
  demoted = { again = true, wait = true, resolve = true, resend = true },
  tryagain = { again = true, wait = true, here = true },
  clusterdown = { again = true, wait = true, resolve = true, here = true },
  connect = { wait = true, resolve = true },
  unsent = { wait = true, resolve = true, resend = true },
  timeout = { wait = true, resolve = true },
  closed = { wait = true, resolve = true },
  connection = { wait = true, resolve = true },
  unnamed = { wait = true, resolve = true }, -- the sentinels name no master now (a failover being undone)
}

-- The classes of a failed connection, and (true) those after which the
-- command may have run: it was sent, and its answer did not come.
local FAILED = { connect = false, unsent = false, timeout = true, closed = true, connection = true }

--- class(err) -> the class of an error message ("transient", "stale",
-- "demoted", "tryagain", "clusterdown", "redirect", "refused", "script",
-- "redis", "connect", "unsent", "timeout", "closed", "connection",
-- "unnamed", "busy", "lost"), or nil for another value.
_M.class = class

--- retry(err, loop) -> whether loop (see RETRY above: "again", "wait",
-- "resolve", "here", "resend") may try again after err.
function _M.retry(err, loop)
  local c = RETRY[class(err)]
  return c ~= nil and c[loop] == true
end

--- connection(err) -> whether err says a connection failed (the server may
-- be down or unreachable), rather than that the server answered.
function _M.connection(err)
  return FAILED[class(err)] ~= nil
end

--- unanswered(err) -> whether err says the command went out and its answer
-- did not come: it may have run on the server.
function _M.unanswered(err)
  return FAILED[class(err)] == true
end

--- codes(loop) -> { CODE = true }: the server's error codes after which
-- loop may try again (for redislock.TRANSIENT, the wait's).
function _M.codes(loop)
  local t = {}
  for code, c in pairs(core.error_codes) do
    if (RETRY[c] or {})[loop] then t[code] = true end
  end
  return t
end

return _M
