-- SPDX-License-Identifier: MIT
--- redislock.election_io: an election's steps on its server, or on each of
-- Redlock's (redislock/election.lua, leadership.lua and observe.lua share
-- them): reading who leads, announcing a change, and under Redlock what a
-- majority of the servers say. The scripts are csrc/scripts/elect_*.lua.

local admin = require("redislock.admin")
local args = require("redislock.args")
local core = require("redislock.core")

local ipairs, pairs, tonumber, type = ipairs, pairs, tonumber, type
local string_format, table_sort = string.format, table.sort
local argerror = args.argerror

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

--- Waiting for ever, as the option 'wait' allows it (2^53 ms): campaign's
-- and observe's default, and what they take math.huge for.
_M.FOREVER = core.MAX_MS / 1000

-- The longest value, in bytes: it rides in the lock's token, which every
-- script on the lock and the names of its waiters' lists carry.
local MAX_VALUE = 1024

--- Raises a bad argument n to fname unless value is a leader's value.
function _M.check_value(n, fname, value)
  if type(value) ~= "string" then
    argerror(n, fname, "value must be a string, got " .. type(value))
  elseif #value > MAX_VALUE then
    argerror(n, fname, string_format("value must be at most %d bytes, got %d", MAX_VALUE, #value))
  end
end

--- split(token) -> the part that names the leader, the value it carries
-- (after the first space; nil for a token without one).
function _M.split(tok)
  local id, value = tok:match("^([^ ]*) (.*)$")
  return id or tok, value
end
local split = _M.split

--- A state reply {token or false, PTTL, term or false} as the leader ({
-- value, term, ttl, token, holder }), or false.
function _M.leader_of(reply)
  local tok, pttl, term = reply[1], reply[2], reply[3]
  if not tok then return false end
  local id, value = split(tok)
  return { value = value, term = tonumber(term), ttl = pttl >= 0 and pttl / 1000 or nil, token = tok,
           holder = admin.holder_of(id) }
end
local leader_of = _M.leader_of

--- servers(election) -> the nodes a step runs on (each of Redlock's
-- servers, or the client's transport) and how many must agree (Redlock's
-- quorum, or 1).
function _M.servers(election)
  local t = election._client._transport
  if t.quorum then return t.nodes, t.quorum end
  return { t }, 1
end
local servers = _M.servers

--- each(election, script, ...) -> replies, err: runs one of the scripts on
-- every server, one after the other: their replies (false where it failed)
-- and the first error.
function _M.each(election, ...)
  local replies, first = {}, nil
  for i, node in ipairs((servers(election))) do
    local reply, err = node:script(...)
    replies[i] = reply ~= nil and reply
    first = first or err
  end
  return replies, first
end
local each = _M.each

-- The leader a majority of state replies agree on (Redlock): the token a
-- quorum holds, its term the largest of theirs, its TTL the quorum-th
-- longest; false when no token can have a majority even with the servers
-- that did not answer; nil and err when it depends on those.
local function agreed(replies, quorum, err)
  local by, silent, most = {}, 0, 0
  for _, r in ipairs(replies) do
    if not r then
      silent = silent + 1
    elseif r[1] then
      local b = by[r[1]] or { n = 0, pttls = {}, term = 0 }
      by[r[1]] = b
      b.n, b.pttls[#b.pttls + 1] = b.n + 1, r[2]
      if r[3] and tonumber(r[3]) > b.term then b.term = tonumber(r[3]) end
      if b.n > most then most = b.n end
    end
  end
  for tok, b in pairs(by) do
    if b.n >= quorum then
      table_sort(b.pttls, function(x, y) return x > y end)
      return leader_of({ tok, b.pttls[quorum], b.term })
    end
  end
  if most + silent >= quorum then return nil, err end
  return false
end

--- read_leader(election) -> the leader now (as leader_of), false, or nil
-- and err.
function _M.read_leader(election)
  local replies, err = each(election, "inspect", election._key)
  local _, quorum = servers(election)
  if quorum > 1 then return agreed(replies, quorum, err) end
  if not replies[1] then return nil, err end
  return leader_of(replies[1])
end

--- announce(election, tok, term): tells observers that tok leads in term
-- (a new leader, or a new value), or with tok "" that term ended and
-- nobody followed. Best effort: an observer that misses it reads the
-- state within its `late`.
function _M.announce(election, tok, term)
  each(election, "elect_announce", election._key, tok, string_format("%.0f", term))
end

return _M
