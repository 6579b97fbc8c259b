-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): contended throughput. 2, 8 and 32 processes on one
-- key (BENCH_CONTEND_PROCS), for each waiting mode the API has (or those of
-- BENCH_CONTEND_MODES), each looping for BENCH_CONTEND_SECONDS (2): acquire
-- with a wait, a read-modify-write of a shared counter under the lock (GET,
-- then SET n+1), release. Reports the total acquisitions per second (those
-- released inside the timed window) and the mutual-exclusion violations,
-- which must be 0: each holder INCRs an "inside" key on entry (more than 1
-- is an overlap) and DECRs it on leaving, and at the end the counter must
-- equal the number of acquisitions made.
-- The ceilings beside them: one process running the section alone (INCR,
-- GET, SET, DECR, no lock) back to back; and, for each number of
-- processes, the same processes running the same sections one at a time
-- under a lock that costs no round trip at all: one token in a local FIFO
-- (read it to enter, write it back to leave; the kernel hands it over, and
-- the process that wrote it back may read it again first, as a barging
-- lock does). No Redis lock on this machine runs the sections faster than
-- that.
-- Where an acquisition's time goes: each worker notes when it got the lock
-- and when it sent the release, for the acquisitions inside the window;
-- sorted together they give the mean section (got to release sent: the
-- four commands, run by whoever holds) and the mean gap (one holder's
-- release sent to the next holder's got: the release, the wake-up and the
-- return from acquire). Their sum is the time per acquisition.
-- Who made it: the share of acquisitions made by the process that made the
-- one before (a barging lock's releaser taking it straight back).
-- What an acquisition costs the machine: the workers' CPU time (os.clock,
-- from the start to their last release) and the server's (INFO cpu, from
-- before the workers' start to their end, so their connecting too), each
-- over the acquisitions made; and how busy that kept the cores.
-- usage: contend.lua                   (the whole benchmark, from bench/run.sh; with
--                                       build/bench/contend_floor, when built)
--        contend.lua worker <mode> <key> <start_at> <stop_at>   (one process)
--        contend.lua worker fifo:<path> <key> <start_at> <stop_at>
local redislock = require("redislock")
local core = require("redislock.core")
local B = require("benchlib")

local TTL, WAIT = 10, 10

-- The FIFO's lock: acquire reads the one token (blocking while another
-- process has it), release writes it back. Unbuffered: one byte a read.
local function fifo_lock(path)
  local f = assert(io.open(path, "r+"))
  f:setvbuf("no")
  local release = function()
    assert(f:write("t"))
    return true
  end
  return function()
    assert(f:read(1) == "t")
    return { release = release }
  end
end

-- One process: prints "done <acquired in window> <acquired in all> <overlaps> <busy> <cpu s>"
-- (its CPU time, user and system, from the start to its last release),
-- then "t <got> <release sent> <each of the first three commands answered>"
-- for each acquisition inside the window.
local function worker(mode, key, start_at, stop_at)
  local client = redislock.new({ port = B.port, timeout = 10 })
  local inside, counter = key .. ":inside", key .. ":counter"
  local fifo = mode:match("^fifo:(.+)$")
  local take = fifo and fifo_lock(fifo)
  local opts = not fifo and B.wait_opts(mode, WAIT)
  local in_window, all, overlaps, busy = 0, 0, 0, 0
  local marks = {}
  assert(client:command("PING")) -- connect before the start
  local delay = start_at - core.now()
  if delay > 0 then core.sleep(delay) end -- start together, so that they compete
  local cpu = os.clock()
  while core.now() < stop_at do
    local lock, err
    if take then lock = take() else lock, err = client:acquire(key, TTL, opts) end
    if lock then
      local got = core.now()
      if assert(client:command("INCR", inside)) > 1 then overlaps = overlaps + 1 end
      local c1 = core.now()
      local n = assert(tonumber(assert(client:command("GET", counter))))
      local c2 = core.now()
      assert(client:command("SET", counter, n + 1))
      local c3 = core.now()
      assert(client:command("DECR", inside))
      local sent = core.now()
      assert(lock:release())
      all = all + 1
      if core.now() <= stop_at then
        in_window = in_window + 1
        marks[#marks + 1] = string.format("t %.6f %.6f %.6f %.6f %.6f", got, sent, c1, c2, c3)
      end
    elseif err:match("^busy") then
      busy = busy + 1
    else
      error(err)
    end
  end
  print(string.format("done %d %d %d %d %.6f", in_window, all, overlaps, busy, os.clock() - cpu))
  print(table.concat(marks, "\n"))
end

if arg[1] == "worker" then
  worker(arg[2], arg[3], tonumber(arg[4]), tonumber(arg[5]))
  os.exit(0)
end

local SECONDS = B.knob("BENCH_CONTEND_SECONDS", 2)
local PROCS = {}
for n in (os.getenv("BENCH_CONTEND_PROCS") or "2 8 32"):gmatch("%d+") do PROCS[#PROCS + 1] = tonumber(n) end

local raw = core.new({ port = B.port })

-- Of the marks (see above): { section = mean section (us), gap = mean gap
-- (us), cmds = the mean time of each of the section's four commands ("a, b,
-- c, d us"), again = the share (%) of acquisitions made by the process that
-- made the one before }, or nil with fewer than two marks.
local function breakdown(marks)
  table.sort(marks, function(a, b) return a[1] < b[1] end)
  local section, gap, cmd, again = 0, 0, { 0, 0, 0, 0 }, 0
  for i, m in ipairs(marks) do
    section = section + (m[2] - m[1])
    if i > 1 then
      gap = gap + (m[1] - marks[i - 1][2])
      if m.worker == marks[i - 1].worker then again = again + 1 end
    end
    local at = { m[1], m[3], m[4], m[5], m[2] }
    for j = 1, 4 do cmd[j] = cmd[j] + (at[j + 1] - at[j]) end
  end
  if #marks < 2 then return nil end
  for j = 1, 4 do cmd[j] = string.format("%.0f", cmd[j] / #marks * 1e6) end
  return { section = section / #marks * 1e6, gap = gap / (#marks - 1) * 1e6,
           cmds = table.concat(cmd, ", ") .. " us", again = again / (#marks - 1) * 100 }
end

-- The server's CPU time so far (user and system, s), from INFO.
local function server_cpu()
  local info = assert(raw:command("INFO", "cpu"))
  return tonumber(info:match("used_cpu_sys:([%d.]+)")) + tonumber(info:match("used_cpu_user:([%d.]+)"))
end

-- Runs procs workers in mode (a waiting mode, or "fifo:<path>" with seed
-- putting the token in); returns acquisitions/s, violations, a note, the
-- CPU time an acquisition cost (us: the workers', the server's), and the
-- breakdown of the marks (see breakdown).
local function run(mode, procs, seed)
  local key = string.format("bench:contend:%s:%d", mode:match("^[^:]*"), procs)
  assert(raw:command("DEL", key, key .. ":inside"))
  assert(raw:command("SET", key .. ":counter", 0))
  -- Time for every process to start and connect (a Lua process takes a few
  -- ms); they then begin together.
  local start_at = core.now() + 0.3 + 0.02 * procs
  local stop_at = start_at + SECONDS
  local pipes = {}
  for i = 1, procs do
    pipes[i] = assert(io.popen(table.concat({ B.lua, B.root .. "/bench/contend.lua", "worker", mode, key,
                                              string.format("%.6f %.6f", start_at, stop_at) }, " ")
                               .. " 2>&1"))
  end
  local server_before = server_cpu()
  if seed then seed() end
  local in_window, all, overlaps, busy, cpu = 0, 0, 0, 0, 0
  local marks = {}
  for i = 1, procs do
    local out = pipes[i]:read("*a")
    pipes[i]:close()
    local a, b, c, d, e = out:match("done (%d+) (%d+) (%d+) (%d+) ([%d.]+)")
    assert(a, "a contention worker failed:\n" .. out)
    for line in out:gmatch("t [%d. ]+") do
      local m = {}
      for v in line:gmatch("[%d.]+") do m[#m + 1] = tonumber(v) end
      m.worker = i
      marks[#marks + 1] = m
    end
    in_window, all = in_window + tonumber(a), all + tonumber(b)
    overlaps, busy, cpu = overlaps + tonumber(c), busy + tonumber(d), cpu + tonumber(e)
  end
  local server = server_cpu() - server_before
  local counter = tonumber(raw:command("GET", key .. ":counter")) or 0
  local violations = overlaps + math.abs(counter - all)
  local note = string.format("%d acquisitions, counter %d, %d overlaps seen, %d waits ran out",
                             all, counter, overlaps, busy)
  local per = function(t) return all > 0 and t / all * 1e6 or 0 end
  return in_window / SECONDS, violations, note, { per(cpu), per(server) }, breakdown(marks)
end

-- Sections per second, run alone by one process for SECONDS (the ceiling).
local function ceiling()
  local client = redislock.new({ port = B.port, timeout = 10 })
  local key = "bench:contend:alone"
  local inside, counter = key .. ":inside", key .. ":counter"
  assert(client:command("SET", counter, 0))
  local n, began = 0, core.now()
  while core.now() - began < SECONDS do
    assert(client:command("INCR", inside))
    local v = assert(tonumber(assert(client:command("GET", counter))))
    assert(client:command("SET", counter, v + 1))
    assert(client:command("DECR", inside))
    n = n + 1
  end
  client:close()
  return n / (core.now() - began)
end

-- Sections per second of procs processes serialized by the FIFO's token.
local function fifo_ceiling(procs)
  local dir = assert(io.popen("mktemp -d")):read("*l")
  local path = dir .. "/token"
  assert(os.execute("mkfifo " .. path))
  local keep = assert(io.open(path, "r+")) -- the FIFO lives while one end is open
  keep:setvbuf("no")
  local rate, violations, _, _, parts = run("fifo:" .. path, procs, function() assert(keep:write("t")) end)
  keep:close()
  os.execute("rm -rf " .. dir)
  assert(violations == 0, "the FIFO's token let two sections overlap")
  return rate, parts
end

-- The breakdown of run id (see breakdown), when it has one.
local function emit_breakdown(id, label, parts)
  if not parts then return end
  B.emit({ name = "contended.section/" .. id, value = math.floor(parts.section + 0.5), unit = "us",
           note = "its commands: " .. parts.cmds, label = label .. ": mean section (lock got to release sent)" })
  B.emit({ name = "contended.gap/" .. id, value = math.floor(parts.gap + 0.5), unit = "us",
           label = label .. ": mean gap (a release sent to the next holder's lock got)" })
  B.emit({ name = "contended.again/" .. id, value = math.floor(parts.again + 0.5), unit = "%",
           label = label .. ": acquisitions made by the process that made the one before" })
end

-- The CPU time an acquisition of run id cost ({ workers', server's }, us),
-- and how busy that kept the machine's cores at rate.
local CORES = tonumber((B.run("nproc"))) or 1
local function emit_cpu(id, label, cpu, rate)
  local total = cpu[1] + cpu[2]
  B.emit({ name = "contended.cpu/" .. id, value = math.floor(total + 0.5), unit = "us",
           note = string.format("the workers %.0f us, the server %.0f us; at this rate the %d cores were %.0f %% busy",
                                cpu[1], cpu[2], CORES, total * rate / 1e6 / CORES * 100),
           label = label .. ": CPU time an acquisition cost (workers and server)" })
end

local client = redislock.new({ port = B.port })
local top = ceiling()
B.emit({ name = "contended.ceiling", value = math.floor(top + 0.5), unit = "sections/s",
         label = "the section alone, one process, no lock" })
for _, procs in ipairs(PROCS) do
  B.say("bench: contention, a local FIFO's token as the lock, %d processes, %g s", procs, SECONDS)
  local rate, parts = fifo_ceiling(procs)
  B.emit({ name = "contended.fifo/" .. procs, value = math.floor(rate + 0.5), unit = "sections/s",
           label = string.format("%d processes, the sections serialized by a local FIFO's token: "
                                 .. "a lock with no round trip, the ceiling of any lock here", procs) })
  emit_breakdown("fifo/" .. procs, string.format("%d processes, the FIFO's token", procs), parts)
end
-- The modes to run: those of BENCH_CONTEND_MODES (e.g. "notify fair") that
-- the API has, else all it has.
local modes = B.wait_modes(client)
local wanted = os.getenv("BENCH_CONTEND_MODES")
if wanted then
  local has = {}
  for _, mode in ipairs(modes) do has[mode] = true end
  modes = {}
  for mode in wanted:gmatch("[^%s,]+") do
    if has[mode] then modes[#modes + 1] = mode else B.say("bench: contention: no mode %q here, left out", mode) end
  end
end
for _, mode in ipairs(modes) do
  for _, procs in ipairs(PROCS) do
    B.say("bench: contention, %s, %d processes, %g s", mode, procs, SECONDS)
    local rate, violations, note, cpu, parts = run(mode, procs)
    local label = string.format("%d processes, one key, %s", procs, B.mode_label(mode))
    local id = string.format("%s/%d", mode, procs)
    emit_breakdown(id, label, parts)
    emit_cpu(id, label, cpu, rate)
    B.emit({ name = "contended/" .. id, value = math.floor(rate + 0.5), unit = "acquisitions/s", note = note,
             baseline = "contended.ceiling", baseline_value = math.floor(top + 0.5),
             label = label .. ": acquisitions/s" })
    B.emit({ name = "violations/" .. id, value = violations, unit = "count", target = { "==", 0 },
             label = label .. ": mutual-exclusion violations" })
  end
end

-- The same workload through raw sockets, no Lua (bench/contend_floor.c):
-- the smallest handoff, and this library's own acquire_wait and release
-- scripts sent as the library sends them. How far a handoff goes here
-- without the library's client around it.
-- BENCH_CONTEND_FLOOR=0 leaves it out (bench/compare.sh does).
local floor_bin = B.root .. "/build/bench/contend_floor"
local probe = os.getenv("BENCH_CONTEND_FLOOR") ~= "0" and core.scripts.acquire_wait and io.open(floor_bin, "r")
if probe then
  probe:close()
  local dir = assert(io.popen("mktemp -d")):read("*l")
  for _, op in ipairs({ "acquire_wait", "release" }) do
    local f = assert(io.open(dir .. "/" .. op .. ".lua", "w"))
    f:write(core.scripts[op].text)
    f:close()
  end
  for _, procs in ipairs(PROCS) do
    for _, how in ipairs({ "minimal", "scripts" }) do
      B.say("bench: contention, C floor (%s), %d processes, %g s", how, procs, SECONDS)
      local cmd = string.format("%s %d %d %g %s", floor_bin, B.port, procs, SECONDS, how)
      if how == "scripts" then cmd = cmd .. string.format(" %s/acquire_wait.lua %s/release.lua", dir, dir) end
      local out = assert(io.popen(cmd .. " 2>&1")):read("*a")
      local rate, violations = out:match("rate=(%d+) violations=(%d+)")
      assert(rate, "bench/contend_floor failed:\n" .. out)
      local label = string.format("%d processes, one key, a raw C client handing over with %s", procs,
                                  how == "minimal" and "the smallest scripts (a counter for a fence, no liveness)"
                                    or "this library's acquire_wait and release scripts")
      B.emit({ name = string.format("contended.c_%s/%d", how, procs), value = tonumber(rate),
               unit = "acquisitions/s", label = label .. ": acquisitions/s" })
      B.emit({ name = string.format("violations/c_%s/%d", how, procs), value = tonumber(violations),
               unit = "count", target = { "==", 0 }, label = label .. ": mutual-exclusion violations" })
    end
  end
  os.execute("rm -rf " .. dir)
end
