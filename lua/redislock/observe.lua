-- SPDX-License-Identifier: MIT
--- redislock.observe: election:observe (redislock/election.lua), an
-- observer told of every change of leader.
--
-- An observer registers beside the election's lock with a stay, and in
-- the same script takes what was announced to it and reads the state (the
-- lock's token, TTL and term: csrc/scripts/elect_observe.lua). Then it blocks
-- on its own list, where new leaders announce themselves (and a leader
-- that proclaims, or resigns with nobody to follow, tells), until the
-- leader's TTL runs out or `late` seconds pass, whichever is first, and
-- does it again. What it hears it passes on in term order, each leader
-- once: an announcement older than what it passed on already is dropped.
-- Under Redlock it blocks on one server (the next, when that one fails),
-- and the state is the majority's.

local args = require("redislock.args")
local backoff = require("redislock.backoff")
local core = require("redislock.core")
local errors = require("redislock.errors")
local hold_mod = require("redislock.hold")
local io_mod = require("redislock.election_io")

local ipairs, tonumber, type = ipairs, tonumber, type
local string_format, table_insert = string.format, table.insert
local math_floor, math_huge, math_max, math_min = math.floor, math.huge, math.max, math.min
local now = core.now
local check_seconds, check_nargs, argerror = args.check_seconds, args.check_nargs, args.argerror
local servers, leader_of, read_leader = io_mod.servers, io_mod.leader_of, io_mod.read_leader

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

-- An observer reads the state again at least this often (seconds), by
-- default, and at most this often; its registration stays this long past
-- its block.
local LATE, MIN_LATE, STAY_SLACK = 2, 0.05, 2

-- An announcement as a leader ("<term> <token>"), or as the end of a term
-- nobody followed ("<term> ": { ended = term }); nil for anything else.
local function heard(news)
  local term, tok = news:match("^(%d+) (.*)$")
  if not term then return nil end
  if tok == "" then return { ended = tonumber(term) } end
  return leader_of({ tok, -1, term })
end

-- The options of observe, checked: late and wait, in seconds.
local OPTS = { late = true, wait = true }
local function observe_opts(opts)
  opts = args.check_opts(2, "observe", opts, OPTS)
  local late = LATE
  if opts.late ~= nil then
    late = check_seconds(2, "observe", "option 'late'", opts.late) / 1000
    if late < MIN_LATE then argerror(2, "observe", string_format("option 'late' must be at least %g s", MIN_LATE)) end
  end
  local wait = io_mod.FOREVER
  if opts.wait ~= nil and opts.wait ~= math_huge then
    -- as acquire's: 0 tells the leader now, once
    local w = opts.wait
    if type(w) ~= "number" or w ~= w or w < 0 or w > io_mod.FOREVER then
      argerror(2, "observe", string_format("option 'wait' must be a number of seconds in 0..%.3f (2^53 ms), got %s",
                                           io_mod.FOREVER, args.show(w)))
    end
    wait = w
  end
  return late, wait
end

--- observe(election, fn[, opts]): calls fn(leader) with the leader now (a
-- table as leader() gives, or false when there is none), then on every
-- change, in term order: a new leader, a value proclaimed, no leader any
-- more. Announced changes come at once; a leader's expiry as it expires;
-- any other change within opts.late seconds (default 2). Runs until fn
-- returns false (then returns true), or opts.wait seconds pass (default:
-- for ever; then returns true), or returns nil and "connection: ..." /
-- "redis: ..." when no server could be used for opts.late seconds.
function _M.observe(self, fn, opts, ...)
  hold_mod.check_open(self._client, "observe")
  args.check_fn(1, "observe", fn)
  local late, wait = observe_opts(opts)
  check_nargs("observe", 2, ...)
  local me = "observer/" .. core.token()
  local nodes, quorum = servers(self)
  local sleep = self._client._sleep
  local deadline = now() + wait
  local at, failing, step, poll = 1, nil, backoff.FIRST, backoff.FIRST
  local last_term, last_tok, told = -1, nil, false
  -- Passes info on unless it is what fn heard last, or older; an ended
  -- term is passed on as "nobody leads" when it is the one fn heard last.
  local function tell(info)
    if info and info.ended then
      if not (told and last_tok and info.ended >= last_term) then return true end
      info = false
    end
    local tok = info and info.token or false
    if told and tok == last_tok then return true end
    if info and info.term and info.term < last_term then return true end
    told, last_tok = true, tok
    if info and info.term then last_term = info.term end
    return fn(info) ~= false
  end
  -- After a failure: true after a pause (doubling; under Redlock the next
  -- server is tried), or false when `late` seconds of failures, or the
  -- wait, would pass first.
  local heard_at = now() -- when a server last answered
  local function pause_after_failure()
    failing = failing or heard_at
    at = at % #nodes + 1
    local next_step = backoff.sleep(sleep, step, math_min(deadline, failing + late) - now(), true)
    if not next_step then return false end
    step = next_step
    return true
  end
  local popped -- what the last block was woken by, told with the state that follows
  local result, result_err = true, nil
  local first = true
  while first or now() < deadline do
    first = false
    local node = nodes[at]
    local reply, err = node:script("elect_observe", self._key, me, string_format("%.0f", (late + STAY_SLACK) * 1000))
    local state
    if reply and quorum > 1 then state, err = read_leader(self) elseif reply then state = leader_of(reply) end
    if state == nil then
      if not pause_after_failure() then
        if failing + late <= deadline then result, result_err = nil, err end
        break
      end
    else
      failing, step, heard_at = nil, backoff.FIRST, now()
      -- Announcements in the order they were made, then the state: the
      -- current leader's with its TTL.
      local news = reply[4]
      if popped then table_insert(news, 1, popped) end
      local stop = false
      for _, n in ipairs(news) do
        local info = heard(n)
        if info and state and info.token == state.token then info = state end
        if info and not tell(info) then
          stop = true
          break
        end
      end
      if stop or not tell(state) or now() >= deadline then break end
      local block = math_min(late, deadline - now())
      if state and state.ttl then block = math_min(block, state.ttl + 0.01) end
      popped = nil
      block = math_floor(math_max(block, 0.001) * 1000)
      local woke, werr = node:wait(self._key, me, block)
      if woke == nil and errors.connection(werr) and now() >= heard_at + late then
        -- The server went quiet while it blocked (the block's own time
        -- and the client's timeout passed): nothing heard for late seconds.
        if heard_at + late <= deadline then result, result_err = nil, werr end
        break
      elseif woke == nil then
        -- No block (under OpenResty the worker's wait_connections may all
        -- be in use; or the server went, which the next read tells): it
        -- reads the state again after a pause, doubling, as a waiter polls.
        poll = backoff.sleep(sleep, poll, block / 1000)
      else
        poll = backoff.FIRST
        popped = type(woke) == "string" and woke or nil
      end
    end
  end
  -- Gone: no announcement for it from now on (best effort; else it leaves
  -- with its stay). Not asked of a server that just failed to answer: that
  -- would cost the client's timeout again.
  if result_err == nil and not failing then nodes[at]:command("ZREM", self._observers, me) end
  return result, result_err
end

_M.OPTIONS = OPTS -- the options' names (spec/40 holds the reference against them)

return _M
