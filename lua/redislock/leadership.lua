-- SPDX-License-Identifier: MIT

--- redislock.leadership: what election:campaign returns (redislock/election.lua).
-- A leadership is a lock object (redislock/lock.lua) on the election's
-- lock, renewed while held, with the term (the lock's fence) and the value
-- (the part of the token after its first space). `proclaim` swaps the
-- value on the server; the renewal (elect_extend) compares the token only
-- up to the value, so it goes on through a swap untouched. `resign` is
-- the lock's release, which hands the lead to the next campaigner.
--
-- Which clients lead which elections is kept here too, so that a second
-- campaign on one client for one name while the first leads is refused.

local args = require("redislock.args")
local backoff = require("redislock.backoff")
local core = require("redislock.core")
local io_mod = require("redislock.election_io")
local lock_mod = require("redislock.lock")

local error, ipairs, pcall, setmetatable, tostring = error, ipairs, pcall, setmetatable, tostring
local string_format = string.format
local check_self, check_nargs, quote, raise_at_caller = args.check_self, args.check_nargs, args.quote,
      args.raise_at_caller
local each, servers, split, announce, check_value = io_mod.each, io_mod.servers, io_mod.split, io_mod.announce,
      io_mod.check_value
local ours_by_clock, set_lost = lock_mod.ours_by_clock, lock_mod.set_lost
local connection_failed = require("redislock.errors").connection

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

--- A leadership: what Election:campaign returns, and what with_leadership
-- passes to its function. A lock on the election's lock, renewed while held.
-- On Lua 5.4 `local lead <close> = ...` resigns on every way out.
-- @type Leadership
-- @field term the leader's term: larger than every earlier leader's (a fence)
-- @field value what this leader tells others (proclaim changes it)
local Leadership = {}
local leadership_mt = { __index = Leadership }

-- The leaderships each client holds, by election name (weakly: client -> {
-- name -> leadership }).
local leading = setmetatable({}, { __mode = "k" })

-- check_alone(election, fname): raises when the election's client leads
-- it already (by its own account).
function _M.check_alone(election, fname)
  local mine = leading[election._client]
  local other = mine and mine[election.name]
  if other and ours_by_clock(other._lock) then
    raise_at_caller(string_format("bad self to '%s' (this client already leads election %s (term %s); resign"
                                  .. " first, or campaign from another client)", fname, quote(election.name),
                                  tostring(other.term)))
  end
end

-- new(election, lock, value, how, ms): the leadership of lock, just taken
-- with how (acquire's options) and TTL ms; noted as its client's, and
-- announced.
function _M.new(election, lock, value, how, ms)
  local lead = setmetatable({ name = election.name, value = value, term = lock.fence, _lock = lock,
                              _election = election, _how = how, _ms = ms }, leadership_mt)
  local mine = leading[election._client] or {}
  mine[election.name], leading[election._client] = lead, mine
  announce(election, lock.token, lock.fence)
  return lead
end

-- done(lead): the leadership ended (resigned, or its scope left): no
-- longer its client's, and observers told when nobody follows.
function _M.done(lead)
  local election = lead._election
  local mine = leading[election._client]
  if mine and mine[election.name] == lead then mine[election.name] = nil end
  if not lead._told then
    lead._told = true
    announce(election, "", lead.term)
  end
end
local done = _M.done

local function check_lead(self, fname)
  check_self(self, leadership_mt, fname, "redislock leadership")
end

-- A leadership whose TTL ran out by this process's clock since the last
-- renewal it knows of (a pause, renewals failing) may be another's now: it
-- is lost for good, even before its renewal says so.
local function by_clock(self)
  local lock = self._lock
  if lock._state == "held" and not ours_by_clock(lock) then
    set_lost(lock, "its TTL ran out by this process's clock (paused, or not renewed in time)")
  end
end

--- Whether this caller still leads: true, or nil and "lost: ..." (as
-- lock:check; with server = true it also asks the server).
-- @tparam[opt] boolean server true: ask the server too
-- @treturn boolean true
-- @return[2] nil
-- @treturn[2] string "lost: ..." (or "connection: ..." / "redis: ..." when asking)
function Leadership:check(server, ...)
  check_lead(self, "check")
  by_clock(self)
  return self._lock:check(server, ...)
end

--- The loss, when this caller no longer leads by its own account (lost,
-- resigned, or its TTL ran out): the "lost: ..." message ("... was already
-- resigned" after a resign); else false. No I/O.
-- @treturn string|false the "lost: ..." message, or false while it leads
function Leadership:lost(...)
  check_lead(self, "lost")
  check_nargs("lost", 0, ...)
  by_clock(self)
  local ok, err = self._lock:check()
  if ok then return false end
  return err
end

--- Seconds left of this leadership's TTL, on the server.
-- @treturn number seconds left
-- @return[2] nil
-- @treturn[2] string "lost: ...", "connection: ..." or "redis: ..."
function Leadership:ttl(...)
  check_lead(self, "ttl")
  return self._lock:ttl(...)
end

--- Gives up the lead: the next campaigner, if any, leads at once (the
-- release hands it the lock). Resigning again is harmless.
-- @treturn boolean true
-- @return[2] nil
-- @treturn[2] string "lost: ...", "connection: ..." or "redis: ..."
function Leadership:resign(...)
  check_lead(self, "resign")
  check_nargs("resign", 0, ...)
  local lock = self._lock
  local ok, err = lock:release()
  if ok then lock._ended = "resigned" end -- not a loss: what it says from now on
  done(self)
  return ok, err
end

-- Sends the proclaim script until a majority (1 but under Redlock) answers
-- whether it took; a connection error is sent again (the script finds its
-- own new token, and answers 1) while the lead is ours by the clock.
-- Returns 1, 0 (free), -1 (another's), or nil and the error.
local function swap(self, new_tok)
  local lock, election = self._lock, self._election
  local _, quorum = servers(election)
  local step = backoff.FIRST
  while true do
    local replies, err = each(election, "elect_proclaim", election._key, lock.token, new_tok,
                              string_format("%.0f", self.term), self._ms)
    local held, other, answered = 0, 0, 0
    for _, r in ipairs(replies) do
      if r then
        answered = answered + 1
        if r == 1 then held = held + 1 elseif r == -1 then other = other + 1 end
      end
    end
    if held >= quorum then return 1 end
    if held + #replies - answered < quorum then return other > 0 and -1 or 0 end
    if not connection_failed(err) then return nil, err end -- refused: nothing was swapped
    local lease = lock._lease
    local room = (lease and lease:expires() or lock._expires or core.now()) - core.now()
    step = backoff.sleep(election._client._sleep, step, room, true)
    if not step then return nil, err end
  end
end

--- Tells a new value while leading, in the same term: leader() and
-- observers see it at once.
-- @string value the new value (at most 1024 bytes)
-- @treturn boolean true
-- @return[2] nil
-- @treturn[2] string "lost: ...", "connection: ..." or "redis: ..."
function Leadership:proclaim(value, ...)
  check_lead(self, "proclaim")
  check_value(1, "proclaim", value)
  check_nargs("proclaim", 1, ...)
  local lock = self._lock
  args.check_phase(lock._t, "proclaim")
  by_clock(self)
  local gone = lock_mod.unusable(lock)
  if gone then return nil, gone end
  local new_tok = split(lock.token) .. " " .. value
  local status, err = swap(self, new_tok)
  if status == 1 then
    lock.token, self.value = new_tok, value
    if lock._note then lock._note.stand_in.token = new_tok end
    return true
  elseif status then
    return nil, set_lost(lock, status == -1 and "another leader holds it now; found at proclaim"
                               or "it expired or was deleted; found at proclaim")
  end
  -- Unanswered until the lead ran out by the clock: whichever token
  -- holds it, it cannot be ours any more.
  by_clock(self)
  return nil, err
end

--- Writes guarded by the term, to client (default: the election's own):
-- lock:fenced's (redislock/guard.lua).
-- @function Leadership:fenced
-- @tparam[opt] redislock.client.Client client where the resource is
-- @treturn redislock.guard.Guard the guard
function Leadership:fenced(...)
  check_lead(self, "fenced")
  return self._lock:fenced(...)
end

--- Writes applied only while this caller leads, on the election's server:
-- lock:owned's.
-- @treturn redislock.guard.Guard the guard
function Leadership:owned(...)
  check_lead(self, "owned")
  return self._lock:owned(...)
end

leadership_mt.__tostring = function(self)
  return string_format("redislock leadership of election %s (term %s, %s)", quote(self.name),
                       tostring(self.term), self._lock._state)
end

-- Lua 5.4 `local lead <close> = ...`: resigns at scope exit (as a lock's
-- __close releases), then tells observers.
leadership_mt.__close = function(self, err)
  local ok, cerr = pcall(lock_mod.lock_mt.__close, self._lock, err)
  done(self)
  if not ok then error(cerr, 0) end
end

return _M
