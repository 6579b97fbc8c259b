-- SPDX-License-Identifier: MIT

--- redislock.metrics_text: redislock.metrics' figures in Prometheus' text
-- format (version 0.0.4), in the conventions of its client libraries:
-- `# HELP` and `# TYPE` once per family, counters ending in `_total`,
-- histograms as cumulative `_bucket`s by `le` up to "+Inf", `_sum` and
-- `_count`, label values escaped (backslash, double quote, line feed).

local core = require("redislock.core")

local ipairs, tonumber, tostring = ipairs, tonumber, tostring
local string_format, table_concat, table_sort = string.format, table.concat, table.sort
local math_floor, math_huge = math.floor, math.huge

local _M = { _VERSION = core._VERSION }

local SEP = "\1"

-- A number as Prometheus reads it: whole numbers without a point, others
-- in the fewest digits that read back the same.
local function num(v)
  if v == math_huge then return "+Inf" elseif v == -math_huge then return "-Inf" elseif v ~= v then return "NaN" end
  if v == math_floor(v) and v > -2^53 and v < 2^53 then return string_format("%d", v) end
  for digits = 15, 16 do
    local s = string_format("%." .. digits .. "g", v)
    if tonumber(s) == v then return s end
  end
  return string_format("%.17g", v)
end

-- A label value, escaped: backslash, double quote, line feed.
local function label(v)
  return '"' .. v:gsub('[\\"]', "\\%0"):gsub("\n", "\\n") .. '"'
end

-- The families, in the order rendered: id (the store's family), name,
-- type, help.
local FAMILIES = {
  { "acquired", "redislock_acquisitions_total", "counter", "Holds acquired." },
  { "busy", "redislock_busy_total", "counter", "Acquires that gave up: held by another owner (busy)." },
  { "released", "redislock_releases_total", "counter", "Holds released." },
  { "lost", "redislock_lost_total", "counter", "Holds found lost: expired, or taken by another owner." },
  { "renew_failed", "redislock_renew_failures_total", "counter",
    "Renewals that failed and were to be tried again (OpenResty's timer)." },
  { "handoff", "redislock_handoffs_total", "counter", "Holds handed to a waiter by a release." },
  { "errors", "redislock_errors_total", "counter", "Calls that failed, by code (connection, redis)." },
  { "held_too_long", "redislock_held_too_long_total", "counter",
    "Holds that ended (released or lost) after more than the held_too_long threshold." },
  { "holds", "redislock_holds", "gauge", "Holds held now: acquired, not yet released nor found lost." },
  { "waiting", "redislock_waiting", "gauge", "Callers in an acquire given a wait (wait > 0), now." },
  { "wait", "redislock_wait_seconds", "histogram", "Seconds from the call to the try that acquired the hold." },
  { "hold", "redislock_hold_seconds", "histogram", "Seconds holds were held, at their release." },
}

-- Sorts rows (each { kind, group, ... }) by kind, then group, then extra.
local function by_labels(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  if a[2] ~= b[2] then return a[2] < b[2] end
  return tostring(a[3]) < tostring(b[3])
end

--- text(rows, buckets): the text of the figures rows (a figure's field,
-- as redislock.metrics keeps it -> its rows { kind, group, code or bucket
-- index or nil, value }); buckets.wait and buckets.hold are the
-- histograms' upper bounds. Families without rows show their HELP and
-- TYPE alone.
function _M.text(rows, buckets)
  local out = {}
  local function line(name, labels, value)
    out[#out + 1] = name .. "{" .. labels .. "} " .. num(value)
  end
  for _, f in ipairs(FAMILIES) do
    local id, name, ftype = f[1], f[2], f[3]
    out[#out + 1] = "# HELP " .. name .. " " .. f[4]
    out[#out + 1] = "# TYPE " .. name .. " " .. ftype
    local list = rows[id] or {}
    if ftype ~= "histogram" then
      table_sort(list, by_labels)
      for _, r in ipairs(list) do
        local labels = "kind=" .. label(r[1]) .. ",group=" .. label(r[2])
        if id == "errors" then labels = labels .. ",code=" .. label(r[3] or "") end
        line(name, labels, r[4])
      end
    else
      local bounds = buckets[id]
      -- kind, group -> counts per bucket (the last: +Inf)
      local hist, order = {}, {}
      for _, r in ipairs(list) do
        local k = r[1] .. SEP .. r[2]
        local h = hist[k]
        if not h then
          h = { r[1], r[2], counts = {} }
          hist[k] = h
          order[#order + 1] = h
        end
        local i = tonumber(r[3])
        if i then
          if i > #bounds then i = #bounds + 1 end -- from other buckets (another configuration): +Inf
          h.counts[i] = (h.counts[i] or 0) + r[4]
        end
      end
      local sums = {}
      for _, r in ipairs(rows[id .. "_sum"] or {}) do sums[r[1] .. SEP .. r[2]] = r[4] end
      table_sort(order, by_labels)
      for _, h in ipairs(order) do
        local labels = "kind=" .. label(h[1]) .. ",group=" .. label(h[2])
        local total = 0
        for i = 1, #bounds + 1 do
          total = total + (h.counts[i] or 0)
          line(name .. "_bucket", labels .. ',le="' .. (i <= #bounds and num(bounds[i]) or "+Inf") .. '"', total)
        end
        line(name .. "_sum", labels, sums[h[1] .. SEP .. h[2]] or 0)
        line(name .. "_count", labels, total)
      end
    end
  end
  return table_concat(out, "\n") .. "\n"
end

return _M
