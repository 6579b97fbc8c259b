-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): handoff latency, the time from a release to the
-- next waiter holding the lock, p50 and p99, for each waiting mode the API has
-- (wait_mode "notify" and "poll", fair = true), for a read-write lock's write
-- lock handed to a waiting writer (mode "rwlock"), and for redis-py's Lock, with
-- the round-trip time of a PING (p50) beside it as the baseline; and the
-- floor for a wake-up: a raw C pair handing off through RPUSH/BLPOP
-- (bench/handoff_floor.c, same holds and cores), to which notify's p50 is
-- also given as a ratio.
--
-- Method. Two processes, a holder and a waiter, on one key, for ROUNDS rounds:
--   1. the holder takes the lock (it is free: the waiter said so, step 6);
--   2. the holder RPUSHes "held" on a signal list; the waiter, blocked in
--      BLPOP on that list, calls acquire with a wait at once;
--   3. the holder keeps the lock for a random 5-15 ms (BENCH_HOLD_MS sets
--      the upper end): the waiter's first attempt finds the lock busy and it
--      is in its wait when the release comes. This is the workload (a
--      critical section), not synchronisation: nothing is timed across it.
--      Where waiters block on the server (notify, fair) the holder then also
--      checks, by INFO's blocked_clients, that the waiter is really blocked
--      before it releases, so the wake-up path is what gets measured;
--   4. the holder reads the monotonic clock, then sends release;
--   5. the waiter reads the monotonic clock as soon as acquire returns;
--   6. the waiter releases and RPUSHes "free", which the holder awaits.
-- Latency = (5) - (4). The holder runs on the server's core (BENCH_SERVER_CPU,
-- where it is idle while the server works) and the waiter on another
-- (BENCH_CLIENT_CPU), as this script, whose PINGs are the baseline. Both clocks are CLOCK_MONOTONIC (core.now, Python's
-- time.monotonic), one clock on one machine, so the two processes' readings
-- compare directly. The signals go over connections of their own. Each
-- process prints its readings at the end; this script pairs them by round.
-- usage: handoff.lua            (the whole benchmark, from bench/run.sh)
--        handoff.lua holder|waiter <mode> <rounds> <key>   (one side)
local redislock = require("redislock")
local core = require("redislock.core")
local B = require("benchlib")

local ROLE = arg[1]
local HOLD_MS = B.knob("BENCH_HOLD_MS", 15)
local TTL, WAIT = 10, 5

-- One side of the handoff; prints "t <round> <clock>" lines.
local function side(role, mode, rounds, key)
  local client = redislock.new({ port = B.port, timeout = 10 })
  -- The hold: a lock, or (mode "rwlock") a read-write lock's write lock,
  -- whose waiter waits as notify's.
  local rw = mode == "rwlock" and client:rwlock(key)
  local function take(opts)
    if rw then return rw:write(TTL, opts) end
    return client:acquire(key, TTL, opts)
  end
  local signals = core.new({ port = B.port, timeout = 30 })
  local held, free = key .. ":held", key .. ":free"
  local times, not_blocked = {}, 0
  -- A seed of our own per process (the token is from the OS CSPRNG).
  math.randomseed(tonumber(core.token():sub(1, 8), 16))
  for i = 1, rounds do
    if role == "holder" then
      if i > 1 then assert(signals:command("BLPOP", free, 30), "the waiter went quiet") end
      local lock = assert(take())
      assert(signals:command("RPUSH", held, i))
      core.sleep((5 + math.random() * (HOLD_MS - 5)) / 1000)
      if mode ~= "poll" and mode ~= "default" then
        local deadline = core.now() + 0.5
        while not assert(signals:command("INFO", "clients")):match("blocked_clients:[1-9]") do
          if core.now() > deadline then not_blocked = not_blocked + 1 break end
          core.sleep(0.0002)
        end
      end
      times[i] = core.now()
      assert(lock:release())
    else
      assert(signals:command("BLPOP", held, 30), "the holder went quiet")
      local lock = assert(take(B.wait_opts(rw and "notify" or mode, WAIT)))
      times[i] = core.now()
      assert(lock:release())
      assert(signals:command("RPUSH", free, i))
    end
  end
  for i, t in ipairs(times) do print(string.format("t %d %.9f", i, t)) end
  print("not_blocked " .. not_blocked)
end

if ROLE then
  side(ROLE, arg[2], tonumber(arg[3]), arg[4])
  os.exit(0)
end

-- Starts a command in the background; returns a function that waits for it and
-- gives its readings by round and its not_blocked count.
local function start(cmd)
  local p = assert(io.popen(cmd .. " 2>&1; echo __EXIT:$?"))
  return function()
    local out = p:read("*a")
    p:close()
    assert(out:match("__EXIT:0\n?$"), "a handoff process failed:\n" .. out)
    local t = {}
    for i, v in out:gmatch("t (%d+) ([%d.]+)") do t[tonumber(i)] = tonumber(v) end
    return t, tonumber(out:match("not_blocked (%d+)")) or 0
  end
end

-- Latencies in microseconds over `rounds` handoffs between the two commands.
local function measure(holder_cmd, waiter_cmd, key, rounds)
  local signals = core.new({ port = B.port })
  assert(signals:command("DEL", key .. ":held", key .. ":free"))
  local wait_waiter = start(waiter_cmd)
  local wait_holder = start(holder_cmd)
  local released, not_blocked = wait_holder()
  local acquired = wait_waiter()
  local us = {}
  for i = 1, rounds do
    local d = (acquired[i] - released[i]) * 1e6
    assert(d > 0, "a waiter held the lock before the holder released it")
    us[i] = d
  end
  return us, not_blocked
end

-- The round trip of one PING from the core client, p50 over n: back to back,
-- or each after a pause like the handoff's hold (idle), which adds what
-- waking a sleeping process costs, as a handoff's waiter must be woken.
local function ping_rtt_us(n, idle)
  local c = core.new({ port = B.port })
  local samples = {}
  for i = 1, n do
    if idle then core.sleep((5 + math.random() * (HOLD_MS - 5)) / 1000) end
    local t0 = core.now()
    assert(c:command("PING"))
    samples[i] = (core.now() - t0) * 1e6
  end
  return B.percentile(samples, 50)
end

local function report(id, label, us, rtt, target, note)
  local p50, p99 = B.percentile(us, 50), B.percentile(us, 99)
  B.emit({ name = "handoff.p50/" .. id, value = math.floor(p50 + 0.5), unit = "us", baseline = "rtt.ping",
           baseline_value = math.floor(rtt + 0.5), target = target, note = note,
           label = label .. ": release to next holder, p50" })
  B.emit({ name = "handoff.p99/" .. id, value = math.floor(p99 + 0.5), unit = "us", baseline = "rtt.ping",
           baseline_value = math.floor(rtt + 0.5), label = label .. ": release to next holder, p99" })
end

local ROUNDS = B.knob("BENCH_HANDOFF_ROUNDS", 300)
local PY_ROUNDS = B.knob("BENCH_HANDOFF_PY_ROUNDS", 100)
local here = B.root .. "/bench/"
local pin = {}
for role, var in pairs({ holder = "BENCH_SERVER_CPU", waiter = "BENCH_CLIENT_CPU" }) do
  local cpu = os.getenv(var)
  pin[role] = cpu and ("taskset -c " .. cpu .. " ") or ""
end
local rtt = ping_rtt_us(2000)
B.emit({ name = "rtt.ping", value = math.floor(rtt + 0.5), unit = "us",
         label = "PING round trip, back to back, p50 (the handoff baseline)" })
local idle_rtt = ping_rtt_us(200, true)
B.emit({ name = "rtt.ping.idle", value = math.floor(idle_rtt + 0.5), unit = "us", baseline = "rtt.ping",
         baseline_value = math.floor(rtt + 0.5), label = "PING round trip after 5-15 ms idle, p50" })

-- The wake-up floor: a raw RPUSH/BLPOP pair, waker where the holder runs.
B.say("bench: handoff floor, raw RPUSH/BLPOP pair, %d rounds", ROUNDS)
local fout, fok = B.run(table.concat({ pin.holder .. B.root .. "/build/bench/handoff_floor", B.port, ROUNDS,
                                       HOLD_MS, os.getenv("BENCH_CLIENT_CPU") or "0" }, " "))
local floor_p50, floor_p99 = tonumber(fout:match("p50_us=([%d.]+)")), tonumber(fout:match("p99_us=([%d.]+)"))
assert(fok and floor_p50, "bench/handoff_floor failed: " .. fout)
B.emit({ name = "handoff.floor.p50", value = math.floor(floor_p50 + 0.5), unit = "us",
         note = string.format("p99 %d us", math.floor(floor_p99 + 0.5)),
         label = "wake-up floor: raw C RPUSH/BLPOP pair (bench/handoff_floor.c), p50" })

local client = redislock.new({ port = B.port })
local modes = B.wait_modes(client)
if client.rwlock then modes[#modes + 1] = "rwlock" end
for _, mode in ipairs(modes) do
  B.say("bench: handoff, %s, %d rounds", mode, ROUNDS)
  local key = "bench:handoff:" .. mode
  local cmd = table.concat({ B.lua, here .. "handoff.lua", "%s", mode, ROUNDS, key }, " ")
  local us, not_blocked = measure(pin.holder .. cmd:format("holder"), pin.waiter .. cmd:format("waiter"), key, ROUNDS)
  local label = mode == "default" and "redislock (waiting as the API does today)"
    or mode == "rwlock" and "redislock, a read-write lock's write lock to a waiting writer"
    or string.format("redislock, %s", B.mode_label(mode))
  report(mode, label, us, rtt, mode == "notify" and { "<=", 2 } or nil,
         not_blocked > 0 and string.format("%d of %d waiters were not seen blocked", not_blocked, ROUNDS) or nil)
  -- The release hands the lock over with the wake-up (notify, fair): the
  -- waiter's first line of work is one RPUSH/BLPOP away from the release.
  B.emit({ name = "handoff.vs_floor/" .. mode, value = math.floor(B.percentile(us, 50) + 0.5), unit = "us",
           baseline = "handoff.floor.p50", baseline_value = math.floor(floor_p50 + 0.5),
           target = (mode == "notify" or mode == "fair" or mode == "rwlock") and { "<=", 1.3 } or nil,
           label = label .. ": release to next holder, p50, vs the RPUSH/BLPOP floor" })
end

local python = "/usr/bin/python3"
local _, has_redis_py = B.run(python .. " -c 'import redis'")
if has_redis_py then
  B.say("bench: handoff, redis-py Lock, %d rounds", PY_ROUNDS)
  local key = "bench:handoff:redis-py"
  local cmd = table.concat({ python, here .. "redis_py.py", "%s", B.port, PY_ROUNDS, key }, " ")
  local us = measure(pin.holder .. cmd:format("holder"), pin.waiter .. cmd:format("waiter"), key, PY_ROUNDS)
  report("redis-py", "redis-py Lock (its default sleep, 0.1 s)", us, rtt)
else
  B.say("bench: no redis-py for %s (sh tools/deps.sh bench installs python3-redis): skipped", python)
end
