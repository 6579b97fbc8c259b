-- SPDX-License-Identifier: MIT

--- redislock.election: leader election. client:election(name) campaigns,
-- tells who leads, and tells observers of every change.
--
-- A leader holds a lock, so leadership has every guarantee of one: taken
-- atomically with its TTL, renewed while held, reported lost, handed to the
-- next campaigner by the release (a resign) in one round trip, fenced. The
-- lock is "election:<name>" (prefix and hash tag as a lock's); its token
-- ends with " <value>", so whoever reads the lock reads the leader's value
-- with it. The acquire scripts keep its holder's fence beside it for as
-- long as the lock (csrc/scripts/lib/grant.lua): that fence is the
-- leader's term, read back by anyone. Terms grow with every leader, and
-- across a failover as fences do (docs/guarantees.md).
--
-- The leadership is redislock/leadership.lua's; observers are
-- redislock/observe.lua's; under OpenResty, `every` is
-- redislock/ngx_every.lua's; the steps on the server(s), and Redlock's
-- majority, are redislock/election_io.lua's.

local args = require("redislock.args")
local hold_mod = require("redislock.hold")
local io_mod = require("redislock.election_io")
local leadership = require("redislock.leadership")
local ngx_every = require("redislock.ngx_every")
local observe = require("redislock.observe")
local scope = require("redislock.scope")

local error, pairs, pcall, setmetatable, type = error, pairs, pcall, setmetatable, type
local string_format = string.format
local math_huge = math.huge
local check_self, check_nargs, check_seconds, quote, argerror =
      args.check_self, args.check_nargs, args.check_seconds, args.quote, args.argerror
local lock_name = hold_mod.lock_name

local _M = { _VERSION = args._VERSION }

args.own(debug.getinfo(1, "S").source)

--- The options of Election:observe.
-- @table observe_options
-- @field late seconds (default 2, at least 0.05): the longest an observer
--   blocks before it reads the state again, so the bound on hearing of a
--   change nobody announced
-- @field wait seconds to observe (default: for ever)

--- The options of Election:every.
-- @table every_options
-- @field ttl the leadership's TTL in seconds (default 5): how soon the job
--   moves when its worker or machine goes away
-- @field value what the leader tells others (default "<host>/<worker pid>")

--- An election: what Client:election returns. No I/O until its methods.
-- @type Election
local Election = {}
local election_mt = { __index = Election }

-- The leadership's scripts: the lock's own, but the renewal that goes on
-- through a proclaim (redislock/leadership.lua).
local LEADERSHIP = { release = "release", extend = "elect_extend", pttl = "pttl", label = "the leadership of %s",
                     kind = "leadership" }

-- The options of campaign that a lock's acquire has but leadership sets itself.
local FIXED = { renew = "a leadership is renewed while held", max_hold = "a leadership lasts until resigned or lost",
                lock_delay = "not built for elections: their renewal and observers keep the TTL alone" }

-- new(client, name): client:election(name), after the client was checked
-- (client.lua). No I/O.
function _M.new(client, name, ...)
  if type(name) ~= "string" then argerror(1, "election", "name must be a string, got " .. type(name)) end
  if name == "" then argerror(1, "election", "name must not be empty") end
  check_nargs("election", 1, ...)
  local key = "election:" .. name
  args.check_key(1, "election", key)
  local lock = lock_name(client, key)
  local self = setmetatable({ name = name, _client = client, _key = key, _lock = lock,
                              _observers = lock .. ":observers" }, election_mt)
  -- How wait.take takes the lock: the acquire scripts only (see above),
  -- as a registered waiter; busy names the election.
  local label = quote(name)
  self._kind = {
    take = "acquire", acquire = "acquire", hand = "acquire_wait", fair = "acquire_fair", leave = "leave",
    keyed = true, ops = LEADERSHIP,
    busy = function(_, left, waited)
      local why = left > 0 and string_format("its term ends in %.3g s unless renewed", left / 1000)
        or "campaigners ahead of this one in the queue"
      if waited > 0 then
        return string_format("busy: election %s still has another leader after waiting %.3g s (%s)", label,
                             waited, why)
      end
      return string_format("busy: election %s has another leader (%s)", label, why)
    end,
  }
  return self
end

--- Who leads now, without campaigning.
-- @treturn table|false { value, term, ttl (seconds left), token, holder },
--   or false when nobody leads
-- @return[2] nil
-- @treturn[2] string "connection: ..." or "redis: ..." (under Redlock also
--   when the answer depends on servers that did not answer)
function Election:leader(...)
  check_self(self, election_mt, "leader", "redislock election")
  hold_mod.check_open(self._client, "leader")
  check_nargs("leader", 0, ...)
  return io_mod.read_leader(self)
end

-- The checked arguments of campaign or with_leadership: ttl in ms and how
-- to take and hold the lock (always renewed; waiting for ever by default).
local function campaign_args(self, fname, value, ttl, opts, nopts, scoped)
  io_mod.check_value(1, fname, value)
  check_seconds(2, fname, "ttl", ttl)
  local o = {}
  if opts ~= nil then
    if type(opts) ~= "table" then argerror(nopts, fname, "options must be a table, got " .. type(opts)) end
    for k, v in pairs(opts) do
      if FIXED[k] and not (k == "renew" and v == true) then
        argerror(nopts, fname, string_format("option '%s' is not available (%s)", k, FIXED[k]))
      end
      o[k] = v
    end
  end
  if o.wait == nil or o.wait == math_huge then o.wait = io_mod.FOREVER end
  o.renew = true
  return hold_mod.hold_args(self._client, fname, ttl, o, nopts, scoped, self._client._transport.refuses,
                            "with 'redlock'")
end

-- Campaigns (arguments checked): the leadership, or nil and err.
local function campaign(self, value, ms, how, fname)
  leadership.check_alone(self, fname)
  local lock, err = hold_mod.hold(self._client, self._key, ms, how,
                                  setmetatable({ tail = " " .. value }, { __index = self._kind }))
  if not lock then return nil, err end
  return leadership.new(self, lock, value, how, ms)
end

--- Campaigns until this caller leads (or opts.wait runs out).
-- @string value (at most 1024 bytes) what the leader tells others (an
--   address, a node's name)
-- @number ttl seconds: a leader that stops renewing (died, paused, cut off)
--   loses the lead this long after its last renewal
-- @tparam[opt] redislock.client.lock_options opts as a lock's acquire: wait
--   (default: for ever), wait_mode, fair, handoff, on_lost, replicas,
--   replica_timeout (renew is always on; max_hold is refused)
-- @treturn redislock.leadership.Leadership the leadership (value, term; check,
--   lost, ttl, proclaim, resign, fenced, owned)
-- @return[2] nil
-- @treturn[2] string "busy: ...", "connection: ..." or "redis: ..."
function Election:campaign(value, ttl, opts, ...)
  check_self(self, election_mt, "campaign", "redislock election")
  local ms, how = campaign_args(self, "campaign", value, ttl, opts, 3, false)
  check_nargs("campaign", 3, ...)
  return campaign(self, value, ms, how, "campaign")
end

local function finish(lead, ok, ...)
  leadership.done(lead)
  if not ok then error((...), 0) end
  return ...
end

--- Calls fn(leadership) once this caller leads, then resigns; with
-- with_lock's guarantees: returns what fn returned, re-raises its error
-- unchanged, raises "busy: ..." / "connection: ..." when it does not come
-- to lead and "lost: ..." when leadership was lost before the end.
-- @string value what the leader tells others (as campaign's)
-- @number ttl seconds (as campaign's)
-- @func fn function(leadership): the work while leading
-- @tparam[opt] redislock.client.lock_options opts as campaign's
-- @return what fn returned, all of it
-- @raise "busy: ...", "connection: ..." or "redis: ..." when it does not come to
--   lead; fn's own error, unchanged; "lost: ..." when the lead was lost
function Election:with_leadership(value, ttl, fn, opts, ...)
  check_self(self, election_mt, "with_leadership", "redislock election")
  local ms, how = campaign_args(self, "with_leadership", value, ttl, opts, 4, true)
  args.check_fn(3, "with_leadership", fn)
  check_nargs("with_leadership", 4, ...)
  local lead, err = campaign(self, value, ms, how, "with_leadership")
  if not lead then error(err, 0) end
  return finish(lead, pcall(scope.hold, lead._lock, function() return fn(lead) end))
end

--- Calls fn(leader) with the leader now, then on every change, in term
-- order (redislock/observe.lua): a new leader, a new value, nobody.
-- @function Election:observe
-- @func fn function(leader): leader as leader() returns it, or false when
--   nobody leads; returning false stops observing
-- @tparam[opt] observe_options opts how late it may hear, and how long it observes
-- @treturn boolean true once fn returned false or opts.wait passed
-- @return[2] nil
-- @treturn[2] string "connection: ..." or "redis: ..." when Redis could not
--   be used for `late` seconds
function Election:observe(...)
  check_self(self, election_mt, "observe", "redislock election")
  return observe.observe(self, ...)
end

--- Under OpenResty, from init_worker_by_lua*: runs fn(term, leadership)
-- every interval seconds on exactly one worker among every nginx that
-- shares the Redis (redislock/ngx_every.lua; in plain Lua it raises).
-- @function Election:every
-- @number interval seconds between runs
-- @func fn function(term, leadership): the job; an error is logged, and
--   the job runs again at its next time
-- @tparam[opt] every_options opts the leadership's TTL and value
-- @treturn boolean true (the timer started)
function Election:every(...)
  check_self(self, election_mt, "every", "redislock election")
  return ngx_every.every(self, ...)
end

election_mt.__tostring = function(self)
  return string_format("redislock election %s", quote(self.name))
end

return _M
