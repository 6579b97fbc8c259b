-- SPDX-License-Identifier: MIT
-- `redislock run --min-hold` and `redislock run -n N` (issue 57), run as
-- child processes against a private redis-server: a lock kept for a minimum
-- after a short (or failing) command, longer than its TTL too, and not cut
-- back by a renewal on its way (a proxy holds it back), also one that timed
-- out and lands late; at most N
-- copies of a command at once across processes, shown by real processes
-- and marker files that would show a third; status listing the permits;
-- bad usage.
local core = require("redislock.core")
local helpers = require("spec.helpers")

local COMMAND = helpers.sh_quote(helpers.spec_dir .. "../bin/redislock")
-- The commands run under the lock start with this: under `make asan` the
-- sanitizers are preloaded for redislock (built for them), not for sh.
local SH = "env -u LD_PRELOAD sh"

describe("redislock run --min-hold and -n", function()
  local srv, raw, tmp

  helpers.redis_and_dir_for(function(s, r, d) srv, raw, tmp = s, r, d end)

  local function file(name) return tmp .. "/" .. name end
  local function prefix() return "REDIS_URL=" .. helpers.sh_quote(srv.url) .. " " .. helpers.lua .. " " .. COMMAND end
  -- Runs `redislock <words>`; returns its output (stdout and stderr), its
  -- exit status and the seconds it took.
  local function redislock_cmd(words)
    local t0 = core.now()
    local out, _, code = helpers.run(prefix() .. " " .. words)
    return out, code, core.now() - t0
  end
  -- Starts it in the background; finish(handle) waits for it and returns
  -- its output and exit status.
  local function redislock_bg(words)
    return assert(io.popen(prefix() .. " " .. words .. " 2>&1; echo __EXIT:$?"))
  end
  local function finish(p)
    local out = p:read("*a")
    p:close()
    return (out:gsub("__EXIT:%d+\n?$", "")), tonumber(out:match("__EXIT:(%d+)"))
  end
  local function lines_of(name)
    local t = {}
    local f = io.open(file(name))
    if not f then return t end
    for l in f:lines() do t[#t + 1] = l end
    f:close()
    return t
  end

  -- Starts spec/workers/delay_proxy.lua in front of the server, holding
  -- the watchdog's writes back delay seconds: its port, log, and a
  -- function that stops it (helpers.start_proxy's).
  local function delay_proxy(delay)
    local log = file("proxy.log")
    local port, stop = helpers.start_proxy("delay_proxy", srv.port, delay, log)
    return port, log, stop
  end
  -- Whether the proxy's log shows a write held before `at` and sent after
  -- it (a renewal on its way then), looked at for up to 5 s.
  local function held_across(log, at)
    return helpers.eventually(5, function()
      for held, sent in (helpers.read_file(log) or ""):gmatch("held ([%d.]+) sent ([%d.]+)") do
        if tonumber(held) < at and tonumber(sent) > at then return true end
      end
    end)
  end

  describe("--min-hold", function()
    it("keeps the lock after a short command: a second run within the minimum is refused, after it runs", function()
      local t0 = core.now()
      local out, code, took = redislock_cmd("run --min-hold 2 job env -u LD_PRELOAD true")
      assert.are.equal(0, code, out)
      assert.is_true(took < 1.5, "it waited for the minimum: " .. took .. " s") -- it exits at once
      local pttl = raw:command("PTTL", "lock:{job}")
      assert.is_true(pttl > 0 and pttl <= 2000, "PTTL " .. pttl)
      out, code = redislock_cmd("run -E 42 job env -u LD_PRELOAD touch " .. helpers.sh_quote(file("second")))
      assert.are.equal(42, code, out)
      assert.matches('^redislock: busy: "job" is held by another owner', out)
      assert.is_nil(io.open(file("second")))
      -- Once the minimum is over, a run takes the lock: never before it.
      local ran = helpers.eventually(8, function()
        local _, c = redislock_cmd("run job env -u LD_PRELOAD touch " .. helpers.sh_quote(file("second")))
        return c == 0 and core.now()
      end)
      assert.is_truthy(ran, "no run took the lock after the minimum")
      assert.is_true(ran - t0 >= 2, "taken again " .. (ran - t0) .. " s after the first was")
      assert.is_truthy(io.open(file("second")))
      assert.are.equal(0, raw:command("EXISTS", "lock:{job}")) -- released: no --min-hold there
    end)

    it("keeps it past --ttl when the minimum is longer, also after a failing command; -w waits it out", function()
      local t0 = core.now()
      local out, code = redislock_cmd("run --ttl 0.5 --min-hold 3 job " .. SH .. " -c 'exit 5'")
      assert.are.equal(5, code, out) -- the command's status
      local pttl = raw:command("PTTL", "lock:{job}")
      assert.is_true(pttl > 500 and pttl <= 3000, "PTTL " .. pttl) -- longer than the TTL
      -- Still held after two TTLs, with nobody renewing it.
      core.sleep(math.max(0, t0 + 1.2 - core.now()))
      if core.now() < t0 + 2.5 then assert.are.equal(1, raw:command("EXISTS", "lock:{job}")) end
      out, code = redislock_cmd("run -w 10 job " .. SH .. " -c 'echo ran'")
      assert.are.equal(0, code, out)
      assert.matches("ran", out)
      assert.is_true(core.now() - t0 >= 3, "ran " .. (core.now() - t0) .. " s after the first was taken")
    end)

    it("is not cut back to --ttl by a renewal on its way as the command ends", function()
      -- The watchdog's connection goes through a proxy that holds each of
      -- its writes back 1.2 s: the renewal sent 2 s after the take (a third
      -- of --ttl 6) is on its way when the command ends, 2.6 s after it,
      -- and reaches Redis after. redislock waits for it before its extend,
      -- else the renewal would set 6 s again over the rest of the minimum.
      assert.are.equal(core.scripts.extend.sha, raw:command("SCRIPT", "LOAD", core.scripts.extend.text))
      local port, log, stop_proxy = delay_proxy(1.2)
      local out, code = redislock_cmd("run --url redis://127.0.0.1:" .. port .. " --timeout 3 --ttl 6 --min-hold 20 job"
        .. " -- " .. SH .. " -c " .. helpers.sh_quote("sleep 2.6; date +%s.%N > " .. file("ended")))
      assert.are.equal(0, code, out)
      local ended = tonumber(helpers.read_file(file("ended")))
      -- The case at hand: a renewal held back when the command ended, sent on after.
      local on_its_way = held_across(log, ended)
      local pout, pok = stop_proxy()
      assert.is_true(pok, pout)
      assert.is_true(on_its_way, "no renewal was on its way as the command ended (" .. ended .. "):\n"
                     .. (helpers.read_file(log) or ""))
      core.sleep(0.1) -- Redis ran what was sent on
      local pttl = raw:command("PTTL", "lock:{job}")
      assert.is_true(pttl > 10000, "PTTL " .. pttl .. ": the renewal cut the minimum back")
    end)

    it("is not cut back by a renewal that timed out on its way and landed after the extend", function()
      -- The proxy holds the watchdog's writes back 1.6 s, longer than a
      -- renewal waits (a third of --ttl 3): the renewal sent 1 s after the
      -- take is on its way when the command ends, times out, and reaches
      -- Redis after redislock's extend, setting 3 s again. redislock, told
      -- that it was never answered, extends on until the rest of the
      -- minimum is within --ttl: the lock still holds past take + 5.6 s.
      assert.are.equal(core.scripts.extend.sha, raw:command("SCRIPT", "LOAD", core.scripts.extend.text))
      local port, log, stop_proxy = delay_proxy(1.6)
      local t0 = core.now()
      local out, code = redislock_cmd("run --url redis://127.0.0.1:" .. port .. " --timeout 3 --ttl 3 --min-hold 8 job"
        .. " -- " .. SH .. " -c " .. helpers.sh_quote("sleep 1.4; date +%s.%N > " .. file("ended")))
      assert.are.equal(0, code, out)
      local ended = tonumber(helpers.read_file(file("ended")))
      local late = held_across(log, ended)
      core.sleep(math.max(0, t0 + 7 - core.now())) -- past take + 5.6 s, when the late renewal's 3 s ran out
      local pout, pok = stop_proxy()
      assert.is_true(pok, pout)
      assert.is_true(late, "no renewal was on its way as the command ended (" .. ended .. "):\n"
                     .. (helpers.read_file(log) or ""))
      local pttl = raw:command("PTTL", "lock:{job}")
      assert.is_true(pttl > 300, "PTTL " .. pttl .. ": the late renewal cut the minimum back")
    end)

    it("releases at once after a command that ran past the minimum, and --min-hold 0 is no minimum", function()
      local out, code = redislock_cmd("run --ttl 1 --min-hold 0.3 job " .. SH .. " -c 'sleep 0.6'")
      assert.are.equal(0, code, out)
      assert.are.equal(0, raw:command("EXISTS", "lock:{job}"))
      out, code = redislock_cmd("run --min-hold 0 job env -u LD_PRELOAD true")
      assert.are.equal(0, code, out)
      assert.are.equal(0, raw:command("EXISTS", "lock:{job}"))
    end)

    it("keeps nothing when the lock was lost: TERM, exit 75", function()
      local p = redislock_bg("run --ttl 0.6 --min-hold 30 job " .. SH .. " -c " .. helpers.sh_quote(
        "trap 'exit 3' TERM; while :; do sleep 0.05; done"))
      assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{job}") == 1 end))
      raw:command("SET", "lock:{job}", "someone else", "PX", 10000)
      local out, code = finish(p)
      assert.are.equal(75, code, out)
      assert.are.equal("someone else", raw:command("GET", "lock:{job}")) -- the other owner's, untouched
      local pttl = raw:command("PTTL", "lock:{job}")
      assert.is_true(pttl <= 10000 and pttl > 5000, "PTTL " .. pttl)
    end)
  end)

  describe("-n", function()
    -- A job: makes its marker in slots/, counts the markers there (a copy
    -- beyond the limit running at once would count one more), logs
    -- "start <pid> <count> <token>", stays `secs`, then removes its marker
    -- (before it exits, so before its permit is given back) and logs "end".
    local function job(secs)
      local slots, log = file("slots"), file("log")
      return SH .. " -c " .. helpers.sh_quote("mkdir -p " .. slots .. "; touch " .. slots .. "/$$; n=$(ls "
        .. slots .. " | wc -l); echo start $$ $n $REDISLOCK_TOKEN >> " .. log .. "; sleep " .. secs
        .. "; rm " .. slots .. "/$$; echo end $$ >> " .. log)
    end
    -- The log's starts: their count, the most markers one saw, their tokens.
    local function starts()
      local n, most, tokens = 0, 0, {}
      for _, l in ipairs(lines_of("log")) do
        local count, tok = l:match("^start %d+ +(%d+) (%S+)$")
        if count then
          n, most = n + 1, math.max(most, tonumber(count))
          tokens[tok] = true
        end
      end
      return n, most, tokens
    end

    it("-n 2: of five started at once, two run at once, the others exit 1 (or -E's) at once", function()
      local procs = {}
      for i = 1, 5 do procs[i] = redislock_bg("run -n 2 -E 9 --label w" .. i .. " slots -- " .. job(3)) end
      -- Both copies are seen running, and listed by status.
      assert.is_truthy(helpers.eventually(10, function() return (starts()) == 2 end), "two copies never ran")
      local out, code = redislock_cmd("status slots")
      assert.are.equal(0, code, out)
      assert.matches("^slots held %(semaphore, 2 permits%)\n", out)
      local _, _, tokens = starts()
      local listed = 0
      local line = "permit: ttl [%d.]+ s; holder: host [^,]+, pid %d+, since [%dTZ:-]+, label w%d; token: (%S+)"
      for tok in out:gmatch(line) do
        assert.is_true(tokens[tok], "status lists a token no running copy has: " .. tok .. "\n" .. out)
        listed = listed + 1
      end
      assert.are.equal(2, listed, out)
      local codes = {}
      for i = 1, 5 do
        local o, c = finish(procs[i])
        codes[c] = (codes[c] or 0) + 1
        if c == 9 then assert.matches('busy: all 2 permits of semaphore "slots" are taken', o) end
      end
      assert.are.same({ [0] = 2, [9] = 3 }, codes)
      local n, most = starts()
      assert.are.equal(2, n)
      assert.are.equal(2, most, "the two copies did not run at once")
      out, code = redislock_cmd("status slots")
      assert.are.equal(1, code, out)
      assert.matches("^slots free\n", out)
      assert.are.equal(0, raw:command("EXISTS", "lock:{slots}:permits"))
    end)

    it("-n 2 -w: five started at once all run, never more than two at once", function()
      local procs = {}
      local t0 = core.now()
      for i = 1, 5 do procs[i] = redislock_bg("run -n 2 -w 60 slots -- " .. job(0.6)) end
      for i = 1, 5 do
        local o, c = finish(procs[i])
        assert.are.equal(0, c, o)
      end
      local n, most = starts()
      assert.are.equal(5, n)
      assert.are.equal(2, most, "never two at once, or more")
      assert.is_true(core.now() - t0 >= 1.8, "three rounds of 0.6 s took " .. (core.now() - t0) .. " s")
      assert.are.equal(0, raw:command("EXISTS", "lock:{slots}:permits"))
    end)

    it("gives the command its permit's token and fence, renews it past --ttl, and keeps it for --min-hold", function()
      local out, code = redislock_cmd("run -n 1 --ttl 0.5 --min-hold 2 one -- " .. SH .. " -c " .. helpers.sh_quote(
        'sleep 1; echo "key=$REDISLOCK_KEY fence=$REDISLOCK_FENCE token=$REDISLOCK_TOKEN held=$(redis-cli -p '
        .. srv.port .. ' ZSCORE "lock:{one}:permits" "$REDISLOCK_TOKEN")"'))
      assert.are.equal(0, code, out)
      local key, fence, token, score = out:match("key=(%S+) fence=(%d+) token=(%S+) held=(%d+)")
      assert.are.equal("one", key, out)
      assert.is_true(tonumber(fence) >= 1)
      assert.is_truthy(score, "the permit was not held after its TTL: " .. out)
      -- Kept for the rest of the minimum: the next run is refused.
      out, code = redislock_cmd("run -n 1 one env -u LD_PRELOAD true")
      assert.are.equal(1, code, out)
      out, code = redislock_cmd("status one")
      assert.are.equal(0, code, out)
      assert.matches("^one held %(semaphore, 1 permit%)\npermit: ttl 0%.%d+ s; holder: [^\n]+; token: "
                     .. token:gsub("%p", "%%%0") .. "\n$", out)
    end)

    it("on a lost permit sends TERM and exits 75", function()
      local p = redislock_bg("run -n 2 --ttl 0.6 --grace 0.5 slots " .. SH .. " -c " .. helpers.sh_quote(
        "trap 'echo got-term; exit 3' TERM; while :; do sleep 0.05; done"))
      assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{slots}:permits") == 1 end))
      raw:command("DEL", "lock:{slots}:permits")
      local out, code = finish(p)
      assert.are.equal(75, code, out)
      assert.matches('lost: a permit of semaphore "slots" is no longer ours', out)
      assert.matches("got%-term", out)
    end)

    it("status shows a lock and a semaphore of one name apart", function()
      local p = redislock_bg("run -n 3 both -- " .. SH .. " -c 'sleep 1'")
      assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{both}:permits") == 1 end))
      local out, code = redislock_cmd("run both -- " .. SH .. " -c " .. helpers.sh_quote(
        prefix() .. " status both"))
      assert.are.equal(0, code, out)
      assert.matches("^both held\nttl: [%d.]+ s\nfence: %S+\nholder: [^\n]+\ntoken: %S+\n"
                     .. "and a semaphore of the same name: 1 permit\npermit: ttl [^\n]+\n$", out)
      assert.are.equal(0, select(2, finish(p)))
    end)
  end)

  it("refuses bad values and combinations with 64 and a line on stderr", function()
    for words, said in pairs({
      ["run --min-hold -1 job true"] = "option '--min-hold' needs a number of seconds, got '-1'",
      ["run --min-hold x job true"] = "option '--min-hold' needs a number of seconds, got 'x'",
      ["run --min-hold=nan job true"] = "option '--min-hold' needs a number of seconds, got 'nan'",
      ["run --min-hold 1e300 job true"] =
        "--min-hold must be a number of seconds from 0 to 9007199254740, got '1e300'",
      ["run -n 0 job true"] = "-n must be a whole number from 1 to 2147483647, got '0'",
      ["run --concurrency 1.5 job true"] = "--concurrency must be a whole number from 1 to 2147483647, got '1.5'",
      ["run -n 3000000000 job true"] = "-n must be a whole number from 1 to 2147483647, got '3000000000'",
      ["run -n two job true"] = "option '-n' needs a whole number from 1, got 'two'",
      ["run -n 2 --concurrency 3 job true"] = "option '--concurrency' is given twice",
      ["run -n 2 --fair job true"] =
        "-n and --fair do not go together (a semaphore hands permits to its waiters in the order they came)",
      ["run -n 2 --redlock redis://127.0.0.1:1,redis://127.0.0.1:2,redis://127.0.0.1:3 job true"] =
        "-n is not available with --redlock (a semaphore counts its permits on one server; use --url,"
        .. " --sentinels or --cluster)",
      ["elect -n 2 jobs true"] = "'elect' takes no option '-n'",
      ["elect --min-hold 5 jobs true"] = "'elect' takes no option '--min-hold'",
      ["status --concurrency 2 job"] = "'status' takes no option '--concurrency'",
      ["break --min-hold 1 job"] = "'break' takes no option '--min-hold'",
    }) do
      local out, code = redislock_cmd(words)
      assert.are.equal(64, code, words .. ": " .. out)
      assert.are.equal("redislock: " .. said .. "\nTry 'redislock --help'.\n", out)
    end
    assert.are.same({}, raw:command("KEYS", "*")) -- nothing was taken
    local out = redislock_cmd("--help")
    assert.matches("%-%-min%-hold SECONDS", out)
    assert.matches("%-n, %-%-concurrency N", out)
  end)
end)
