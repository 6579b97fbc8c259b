-- SPDX-License-Identifier: MIT
--- redislock.ngx_watch: the Sentinel watch under OpenResty (core.sentinel_watch
-- is its plain-Lua twin, a C thread). One timer per worker and master stays
-- subscribed to +switch-master on one of the sentinels, the next one when it
-- fails, and counts what it hears: a switch of the master, or a subscription
-- lost or made, and keeps the master the last switch announced. Each client
-- (redislock/sentinel.lua) compares the count before each command; on a
-- switch the timer also points every client of that master at the new one
-- at once (their transports, which their renewals use too). The timer ends
-- when the last of its clients was closed or collected, or the worker exits.

local args = require("redislock.args")
local core = require("redislock.core")

local ngx = ngx
local ipairs, next, pairs, setmetatable, tonumber, tostring = ipairs, next, pairs, setmetatable, tonumber, tostring
local table_concat = table.concat

local _M = { _VERSION = core._VERSION }

args.own(debug.getinfo(1, "S").source)

-- Between one sentinel failing and asking the next (seconds).
local RETRY = 0.2

-- Running watches of this worker, by master and sentinels.
local watches = {}

local Watch = {}
local watch_mt = { __index = Watch }

function Watch:count()
  return self.n
end

-- The master the last switch heard announced (host, port), while nothing
-- else was counted since (no subscription lost or made after it); else nil.
function Watch:heard()
  if self.at == self.n then return self.host, self.port end
end

-- The client no longer needs it (the timer ends when none does).
function Watch:close(client)
  self.clients[client] = nil
end

-- Whether the timer should end.
local function done(w)
  return ngx.worker.exiting() or next(w.clients) == nil
end

-- A published "<master> <old ip> <old port> <new ip> <new port>".
local function heard(w, text)
  local name, _, _, host, port = text:match("^(%S+) (%S+) (%d+) (%S+) (%d+)$")
  if name ~= w.master then return end
  w.n = w.n + 1
  w.host, w.port, w.at = host, tonumber(port), w.n
  for client in pairs(w.clients) do client:switched(w.host, w.port) end
end

local function run(premature, w)
  local i = 1
  while not premature and not done(w) do
    local t = w.sentinels[i]
    w.listening = true
    t:listen("+switch-master", function(text) heard(w, text) end, function()
      if w.listening then -- subscribed: a switch before it may have gone unheard
        w.listening = false
        w.n = w.n + 1
      end
      return done(w)
    end)
    w.n = w.n + 1 -- not subscribed now
    i = i % #w.sentinels + 1
    if not done(w) then ngx.sleep(RETRY) end
  end
  watches[w.key] = nil
end

--- The watch of master on sentinels (their transports, redislock/ngx.lua's),
-- started if needed, with client (which has :switched(host, port)) among
-- those it serves (weakly). Returns it, or nil and why the timer did not start.
function _M.get(master, sentinels, client)
  local where = {}
  for i, t in ipairs(sentinels) do where[i] = t.where end
  local key = master .. "\0" .. table_concat(where, ",")
  local w = watches[key]
  if not w then
    w = setmetatable({ key = key, master = master, sentinels = sentinels, n = 0,
                       clients = setmetatable({}, { __mode = "k" }) }, watch_mt)
    local ok, err = ngx.timer.at(0, run, w)
    if not ok then return nil, "cannot start the Sentinel watch (ngx.timer.at: " .. tostring(err) .. ")" end
    watches[key] = w
  end
  w.clients[client] = true
  return w
end

return _M
