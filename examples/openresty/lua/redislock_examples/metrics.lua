-- SPDX-License-Identifier: MIT
--- Example (d): redislock's events as Prometheus metrics. The client of
-- every worker (common.lua) has observe() as its observer; it counts into
-- the shared dict `redislock_metrics` (redislock.conf declares it), which
-- all workers share, and GET /metrics renders the counts in Prometheus' text
-- format for a scraper:
--
--     redislock_events_total{event="acquired",kind="lock"} 12
--     redislock_wait_seconds_total{kind="lock"} 0.53     time spent waiting to acquire
--     redislock_hold_seconds_total{kind="lock"} 1.21     time held, counted at release
--
-- Events: acquired, busy, released, lost, renew_failed (redislock's observer
-- hook); kinds: lock, permit, read lock, write lock.

local pairs, string_format, table_concat, table_sort = pairs, string.format, table.concat, table.sort

local _M = {}

local SEP = "\1" -- between the parts of a dict key

--- The observer: function(event, info) for redislock.new. Cheap and never
-- yielding (a shared dict), so it is fine in every phase.
function _M.observe(event, info)
  local dict = ngx.shared.redislock_metrics
  if not dict then return end -- not declared: no metrics
  dict:incr("events" .. SEP .. event .. SEP .. info.kind, 1, 0)
  if info.wait then dict:incr("wait_seconds" .. SEP .. info.kind, info.wait, 0) end
  if info.held then dict:incr("hold_seconds" .. SEP .. info.kind, info.held, 0) end
end

local HELP = {
  events = { "redislock_events_total", "Lock events in this nginx's workers, by event and kind of hold." },
  wait_seconds = { "redislock_wait_seconds_total", "Seconds spent waiting before holds were acquired." },
  hold_seconds = { "redislock_hold_seconds_total", "Seconds holds were held, counted at their release." },
}

local function label(v)
  return '"' .. v:gsub('[\\"]', "\\%0"):gsub("\n", "\\n") .. '"'
end

--- GET /metrics: the counts in Prometheus' text format (version 0.0.4).
function _M.handle()
  local dict = ngx.shared.redislock_metrics
  local rows = {}
  for _, key in pairs(dict and dict:get_keys(0) or {}) do
    local name, a, b = key:match("^([^\1]+)\1([^\1]+)\1?([^\1]*)$")
    local value = dict:get(key)
    if name and value then
      local labels = b ~= "" and string_format("{event=%s,kind=%s}", label(a), label(b))
                     or string_format("{kind=%s}", label(a))
      rows[name] = rows[name] or {}
      rows[name][#rows[name] + 1] = HELP[name][1] .. labels .. " " .. string_format("%.14g", value)
    end
  end
  local out = {}
  for _, name in pairs({ "events", "wait_seconds", "hold_seconds" }) do
    out[#out + 1] = "# HELP " .. HELP[name][1] .. " " .. HELP[name][2]
    out[#out + 1] = "# TYPE " .. HELP[name][1] .. " counter"
    local list = rows[name] or {}
    table_sort(list)
    for _, row in pairs(list) do out[#out + 1] = row end
  end
  ngx.header["Content-Type"] = "text/plain; version=0.0.4"
  ngx.print(table_concat(out, "\n"), "\n")
end

return _M
