-- SPDX-License-Identifier: MIT
-- The torture checker: reads the workers' logs (torture/section.lua says what
-- each line means) and the register, and judges the run.
--  * overlaps: two sections of one key whose [entry, exit] intervals cross on
--    the shared monotonic clock. Told when either side heard of it from
--    redislock (with_lock raised lost or connection after fn); silent
--    otherwise, even when the register refused a stale write; a silent one
--    that crosses a window of o.windows (a Redlock server's clock jumped),
--    or (o.failover) whose sections two masters granted (the E line's
--    node), is counted apart, as what the design allows. Checked again
--    without any clock, in the order the register saw entries and exits.
--  * fences: two sections of one key with the same fence (duplicates; not
--    when they have the same token too: a lock handed down within an nginx
--    worker, one section after the other), or a
--    section that entered after another one left, whose lock was asked for
--    after that one entered, yet holds a lower fence (inversions), across
--    every fault and whichever master granted either: fences follow the
--    granting server's clock (csrc/scripts/lib/next_fence.lua), so a server
--    restarted without its data, a promoted replica, a deposed master still
--    granting and an old master named again after a failover undone all
--    hand out fences above every one handed out before. Refused stale
--    writes (the register answered stale) are the fence doing its job,
--    counted; but a section that overlapped no other section of its key
--    and was not told (with_lock raised nothing) held the lock alone by
--    every account: its write refused is a legitimate write refused,
--    counted apart while a fault ran (its window: from its start to a TTL
--    and a second after its end), an anomaly outside every fault's window.
--  * lost updates: the register's counter against the sections that wrote it.
--  * crashes (a worker that exited non-zero or without its DONE line), hangs,
--    errors without a code word, redis errors while wait time was left, and
--    lock keys left after everything expired.
-- Holds when there are no silent overlaps (but those counted apart), fence
-- anomalies (legitimate writes refused outside every fault's window among
-- them), crashes, hangs, uncoded errors or redis errors with wait left,
-- and no keys are left.
local helpers = require("spec.helpers")

local _M = {}


-- Reads one worker's log into its sections and failures.
local function read_log(w, sections, failures)
  local text = helpers.read_file(w.log) or ""
  local open, done = nil, false
  for line in text:gmatch("[^\n]+") do
    local kind, rest = line:match("^(%u+) ?(.*)$")
    if kind == "E" then
      local t, key, fence, mode, node, sent, token = rest:match("^(%S+) (%S+) (%d+) (%S+) ?(%S*) ?(%S*) ?(%S*)")
      open = { worker = w.id, enter = tonumber(t), key = key, fence = tonumber(fence), mode = mode,
               node = node, sent = tonumber(sent) or tonumber(t),
               token = token ~= "" and token or nil }
      sections[#sections + 1] = open
    elseif kind == "X" and open then
      local t, outcome = rest:match("^(%S+) %S+ %d+ (%S+)")
      open.exit, open.outcome = tonumber(t), outcome
    elseif kind == "L" and open then
      local t, code = rest:match("^(%S+) %S+ (%S+)")
      open.ended = code
      if code == "lost" or code == "connection" then open.told = true end
      if code ~= "lost" and code ~= "connection" and code ~= "redis" then
        failures[#failures + 1] = { worker = w.id, code = code, text = rest, at = tonumber(t) }
      end
      open = nil
    elseif kind == "F" then
      local t, key, code, waited, wait, msg = rest:match("^(%S+) (%S+) (%S+) (%S+) (%S+) (.*)$")
      failures[#failures + 1] = { worker = w.id, key = key, code = code, waited = tonumber(waited),
                                  wait = tonumber(wait), text = msg, at = tonumber(t) }
      open = nil
    elseif kind == "DONE" then
      done = true
    end
  end
  -- A section cut short (the worker died inside it) lasts to the end.
  for _, s in ipairs(sections) do
    if not s.exit then s.exit, s.cut = math.huge, true end
  end
  return done
end

local function commas(n)
  local s = tostring(n)
  while true do
    local t, k = s:gsub("^(%d+)(%d%d%d)", "%1,%2")
    s = t
    if k == 0 then return s end
  end
end

--- Judges a run: o = { topology, workers, hung, nkeys, seconds, faults,
-- register(cli args...) -> string, keys_left, seed, failover, windows,
-- fault_log ({ from, to, kind } per fault injected), ttl }. Returns { ok,
-- summary, details, by_fault (a line per kind of fault) }.
function _M.run(o)
  local sections, failures, details = {}, {}, {}
  local crashes = 0
  for _, w in ipairs(o.workers) do
    local done = read_log(w, sections, failures)
    local status = tonumber(helpers.read_file(w.status) or "")
    if status ~= 0 or not done then
      crashes = crashes + 1
      details[#details + 1] = string.format("worker %d (%s) crashed: status %s; %s", w.id, w.lua, tostring(status),
                                            (helpers.read_file(w.out) or ""):sub(1, 300))
    end
  end

  -- Overlaps and fences, key by key.
  local silent, told, dups, inversions, stale, silent_stale = 0, 0, 0, 0, 0, 0
  local refused, refused_out = 0, 0 -- legitimate writes refused, and those outside every fault's window
  local clock, clock_order = 0, 0 -- silent overlaps during a clock jump
  local split, split_order = 0, 0 -- silent overlaps of sections two masters granted (o.failover)
  -- Whether sections a and b (when known) were both inside during a clock jump.
  local function jumped(a, b)
    if not (a and b) then return false end
    local from, to = math.max(a.enter, b.enter), math.min(a.exit, b.exit)
    for _, w in ipairs(o.windows or {}) do
      if from <= w[2] and to >= w[1] then return true end
    end
    return false
  end
  -- What happened while each kind of fault ran (and for a TTL and a second
  -- after it, while its effects last): the fault that began last before t.
  local by_fault, fault_order = {}, {}
  local windows_in = o.fault_log or {}
  -- The kind of fault whose window holds t, or nil.
  local function fault_at(t)
    local kind
    for _, f in ipairs(windows_in) do
      if f.from <= t and t <= f.to + (o.ttl or 1) + 1 then kind = f.kind end
    end
    return kind
  end
  local function tally(t, field)
    local kind = fault_at(t) or "no fault"
    local row = by_fault[kind]
    if not row then
      row = { kind = kind, sections = 0, told = 0, allowed = 0, silent = 0, anomalies = 0, stale = 0, refused = 0,
              failed = {} }
      by_fault[kind] = row
      fault_order[#fault_order + 1] = row
    end
    if field == "failed" then return row end
    row[field] = row[field] + 1
  end
  local by_key = {}
  for _, s in ipairs(sections) do
    tally(s.enter, "sections")
    by_key[s.key] = by_key[s.key] or {}
    table.insert(by_key[s.key], s)
    if s.outcome == "stale" then
      tally(s.exit, "stale")
      stale = stale + 1
      if not (s.ended == "lost" or s.ended == "connection") then silent_stale = silent_stale + 1 end
    end
  end
  local writes = 0
  for key, list in pairs(by_key) do
    table.sort(list, function(a, b) return a.enter < b.enter end)
    local seen = {}
    for i, a in ipairs(list) do
      if a.outcome then writes = writes + 1 end
      local id = a.fence
      -- The same fence with the same token is one lock handed down within
      -- an nginx worker (redislock/ngx_gate.lua), section after section.
      if seen[id] and not (a.token and seen[id].token == a.token) then
        dups = dups + 1
        tally(a.enter, "anomalies")
        details[#details + 1] = string.format("%s: fence %d taken twice (workers %d and %d)", key, a.fence,
                                              seen[id].worker, a.worker)
      end
      seen[id] = a
      for j = i + 1, #list do
        local b = list[j]
        if b.enter >= a.exit then
          -- A lower fence is an inversion when b's lock was asked for after
          -- a entered (a's lock was granted before that): a holder stopped
          -- between its grant and its entry (Redlock's two phases leave a
          -- wide window) enters late, with the fence it was granted before
          -- a's, and is told it lost the lock.
          if b.fence < a.fence and b.sent >= a.enter then
            inversions = inversions + 1
            tally(b.enter, "anomalies")
            details[#details + 1] = string.format("%s: fence %d (worker %d, master %s, write %s) entered after fence "
              .. "%d (worker %d, master %s) left", key, b.fence, b.worker, b.node, tostring(b.outcome), a.fence,
              a.worker, a.node)
          end
        elseif a.worker ~= b.worker then
          a.overlapped, b.overlapped = true, true
          if a.told or b.told then
            told = told + 1
            tally(b.enter, "told")
          elseif jumped(a, b) then
            clock = clock + 1
            tally(b.enter, "allowed")
          elseif o.failover and a.node ~= b.node then
            split = split + 1
            tally(b.enter, "allowed")
          else
            silent = silent + 1
            tally(b.enter, "silent")
            details[#details + 1] = string.format("%s: silent overlap, worker %d (fence %d, %.3f-%.3f) and worker %d "
              .. "(fence %d, %.3f-%.3f)", key, a.worker, a.fence, a.enter, a.exit, b.worker, b.fence, b.enter, b.exit)
          end
        end
      end
    end
  end
  -- Writes refused to a section that held the lock alone, and was not told.
  for _, s in ipairs(sections) do
    if s.outcome == "stale" and not s.told and not s.overlapped then
      refused = refused + 1
      if fault_at(s.exit) then
        tally(s.exit, "refused")
      else
        refused_out = refused_out + 1
        tally(s.exit, "anomalies")
        details[#details + 1] = string.format("%s: fence %d (worker %d, master %s) held the lock alone, its write "
          .. "refused at %.3f, outside every fault's window", s.key, s.fence, s.worker, s.node, s.exit)
      end
    end
  end
  -- The same, clock-free: in the register's order of "in"/"out" events.
  local silent_order, told_order = 0, 0
  local function section_of(key, worker, fence)
    for _, s in ipairs(by_key[key] or {}) do
      if s.worker == worker and s.fence == fence then return s end
    end
  end
  for k = 1, o.nkeys do
    local key = "k" .. k
    local inside = {}
    for event in o.register("LRANGE", "history:" .. key, "0", "-1"):gmatch("[^\n]+") do
      local what, worker, fence = event:match("^(%a+) (%d+) (%d+)$")
      worker, fence = tonumber(worker), tonumber(fence)
      if what == "in" then
        local a = section_of(key, worker, fence)
        for other, ofence in pairs(inside) do
          local b = section_of(key, other, ofence)
          if (a and a.told) or (b and b.told) then
            told_order = told_order + 1
          elseif jumped(a, b) then
            clock_order = clock_order + 1
          elseif o.failover and a and b and a.node ~= b.node then
            split_order = split_order + 1
          else
            silent_order = silent_order + 1
            details[#details + 1] = string.format("%s: in the register's order, worker %d (fence %d) entered while "
              .. "worker %d (fence %d) was inside, and neither was told", key, worker, fence, other, ofence)
          end
        end
        inside[worker] = fence
      elseif what == "out" then
        inside[worker] = nil
      end
    end
  end

  local counted = 0
  for k = 1, o.nkeys do counted = counted + (tonumber(o.register("GET", "count:k" .. k)) or 0) end

  local uncoded, redis_with_wait = 0, 0
  local codes = {}
  for _, f in ipairs(failures) do
    codes[f.code] = (codes[f.code] or 0) + 1
    if f.at then
      local failed = tally(f.at, "failed").failed
      failed[f.code] = (failed[f.code] or 0) + 1
    end
    if f.code ~= "busy" and f.code ~= "lost" and f.code ~= "connection" and f.code ~= "redis" then
      uncoded = uncoded + 1
      details[#details + 1] = string.format("worker %d: an error without a code word: %s", f.worker, f.text)
    elseif f.code == "redis" and f.waited and f.wait and f.waited < f.wait - 0.05 then
      redis_with_wait = redis_with_wait + 1
      details[#details + 1] = string.format("worker %d: a redis error after %.2f of %.2f s: %s", f.worker,
                                            f.waited, f.wait, f.text)
    end
  end
  for _, key in ipairs(o.keys_left) do details[#details + 1] = "left behind: " .. key end
  for _, id in ipairs(o.hung) do details[#details + 1] = "worker " .. id .. " hung (killed)" end

  local fences_ok = dups == 0 and inversions == 0 and refused_out == 0
  local ok = silent == 0 and silent_order == 0 and fences_ok and crashes == 0
    and #o.hung == 0 and uncoded == 0 and redis_with_wait == 0 and #o.keys_left == 0
  local code_list = {}
  for code, n in pairs(codes) do code_list[#code_list + 1] = code .. " " .. n end
  table.sort(code_list)
  local summary = string.format(
    "torture %s: %s: %d silent overlaps in %s sections (%d workers, %g s, %d faults, seed %d); %d told overlaps; "
      .. "in the register's order %d silent, %d told%s; "
      .. "fences %s (%d duplicates, %d inversions; %d stale writes refused, %d of them silent; %d legitimate writes "
      .. "refused (the lock held alone, not told), %d of them outside every fault's window); "
      .. "%d lost updates; %d crashes, %d hangs, %d uncoded errors, %d redis errors with wait left, %d keys left; "
      .. "failed calls: %s",
    o.topology or "single", ok and "holds" or "FAILS", silent, commas(#sections), #o.workers, o.seconds, o.faults,
    o.seed, told, silent_order, told_order,
    (o.windows and string.format("; during %d clock jumps %d silent overlaps (%d in the register's order)", #o.windows,
                                 clock, clock_order) or "")
      .. (o.failover and string.format("; %d silent overlaps of sections two masters granted (%d in the register's "
                                       .. "order)", split, split_order) or ""),
    fences_ok and "ok" or "BROKEN", dups, inversions, stale, silent_stale, refused, refused_out,
    writes - counted, crashes, #o.hung, uncoded, redis_with_wait, #o.keys_left,
    #code_list > 0 and table.concat(code_list, ", ") or "none")
  -- One line per kind of fault, the most sections first.
  table.sort(fault_order, function(x, y) return x.sections > y.sections end)
  local lines = {}
  for _, row in ipairs(fault_order) do
    local failed = {}
    for code, n in pairs(row.failed) do failed[#failed + 1] = code .. " " .. n end
    table.sort(failed)
    lines[#lines + 1] = string.format("%s: %s sections, %d told overlaps, %d silent overlaps the design allows, "
      .. "%d other silent overlaps, %d fence anomalies, %d stale writes refused (%d of them legitimate); failed "
      .. "calls: %s", row.kind, commas(row.sections), row.told, row.allowed, row.silent, row.anomalies, row.stale,
      row.refused,
      #failed > 0 and table.concat(failed, ", ") or "none")
  end
  return { ok = ok, summary = summary, details = details, by_fault = lines }
end

return _M
