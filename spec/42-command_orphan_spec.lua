-- SPDX-License-Identifier: MIT
-- The command of `redislock run` and `redislock elect` does not outlive its
-- `redislock` (issue 53): when that process is killed (SIGKILL, as the OOM
-- killer does), COMMAND gets TERM at once and KILL after --grace, or half
-- the TTL when shorter, so it has ended before the lock (the leadership)
-- runs out and the next holder's COMMAND starts. Real processes: the jobs
-- append time-stamped lines to one log, which shows any overlap.
local core = require("redislock.core")
local helpers = require("spec.helpers")

local COMMAND = helpers.sh_quote(helpers.spec_dir .. "../bin/redislock")

describe("a job whose redislock is killed", function()
  local srv, raw, tmp

  helpers.redis_and_dir_for(function(s, r, d) srv, raw, tmp = s, r, d end)

  local function file(name) return tmp .. "/" .. name end
  -- After a failed assertion: no process of the spec's is left running.
  after_each(function()
    for _, name in ipairs({ "rl-a", "rl-b", "job-a", "job-b" }) do
      local f = io.open(file(name))
      local pid = f and f:read("n")
      if f then f:close() end
      if pid then os.execute("kill -KILL " .. pid .. " 2>/dev/null") end
    end
  end)
  local function read(name)
    local f = io.open(file(name))
    if not f then return nil end
    local s = f:read("a")
    f:close()
    return s
  end
  -- Whether pid runs: a zombie does not (an orphan waits for whoever
  -- reaps it, which takes its time on a loaded machine).
  local function alive(pid)
    local state = helpers.run("ps -o stat= -p " .. pid):gsub("%s", "")
    return state ~= "" and not state:find("^Z")
  end

  -- Starts `redislock <words>` in the background; its pid (redislock's own:
  -- the shell execs env, which execs it) is in the file pidname. (env, as
  -- helpers.lua may begin with an assignment: make asan's LD_PRELOAD.)
  local function start(pidname, words)
    local cmd = "REDIS_URL=" .. helpers.sh_quote(srv.url) .. " exec env " .. helpers.lua .. " " .. COMMAND .. " "
                .. words
    return assert(io.popen("sh -c " .. helpers.sh_quote("echo $$ > " .. file(pidname) .. "; " .. cmd)
                           .. " >/dev/null 2>&1; echo __EXIT:$?"))
  end
  local function number_in(name)
    return helpers.eventually(10, function() return tonumber(read(name) or "") end)
  end

  -- A job that writes its pid to pidname, then "<tag> <ns since the epoch>"
  -- to the shared log every 0.05 s; ignoring TERM unless honour.
  local function job(tag, pidname, honour)
    local trap = honour and "trap 'echo " .. tag .. "-term >> " .. file("log") .. "; exit 3' TERM"
                 or "trap '' TERM"
    return "env -u LD_PRELOAD sh -c " .. helpers.sh_quote("echo $$ > " .. file(pidname) .. "; " .. trap
      .. "; while :; do echo " .. tag .. " $(date +%s%N) >> " .. file("log") .. "; sleep 0.05; done")
  end

  -- The log's lines of tag, as numbers (ns), in order.
  local function stamps(tag)
    local t = {}
    for s in (read("log") or ""):gmatch(tag .. " (%d+)\n") do t[#t + 1] = tonumber(s) end
    return t
  end

  -- Starts `redislock <words> -- <job "a">` (job("a", "job-a", honour));
  -- returns its pipe, and redislock's and the job's PIDs once both wrote them.
  local function start_a(words, honour)
    local a = start("rl-a", words .. " -- " .. job("a", "job-a", honour))
    local rpid, jpid = number_in("rl-a"), number_in("job-a")
    assert.is_truthy(rpid and jpid, "redislock or its job never started")
    return a, rpid, jpid
  end

  -- Kills redislock (pid) with SIGKILL; returns how long its job (pid)
  -- ran on (seconds), and whether the lock key still existed when it was
  -- seen gone.
  local function kill_and_watch(rpid, jpid, key)
    local t0 = core.now()
    assert.is_true(helpers.sh_ok("kill -KILL " .. rpid))
    assert.is_truthy(helpers.eventually(20, function() return not alive(jpid) end), "the job runs on")
    return core.now() - t0, raw:command("EXISTS", key) == 1
  end

  it("run: a job that ignores TERM is killed after half the TTL, before the next holder's job starts", function()
    local a, rpid, jpid = start_a("run --ttl 4 --grace 30 job")
    local b = start("rl-b", "run -w 30 --ttl 4 job -- " .. job("b", "job-b", true))
    core.sleep(0.5)
    local ran_on, still_held = kill_and_watch(rpid, jpid, "lock:{job}")
    assert.is_true(ran_on < 4, "the job ran on " .. ran_on .. " s, past the TTL")
    assert.is_true(ran_on > 1.5, "killed before half the TTL: " .. ran_on) -- the grace was honoured up to there
    assert.is_true(still_held, "the lock ran out before the job was gone")
    -- the next holder's job comes after the last line of the first
    local bpid = number_in("job-b")
    assert.is_truthy(bpid, "the waiting redislock never ran its job")
    assert.is_truthy(helpers.eventually(5, function() return #stamps("b") >= 3 end))
    local sa, sb = stamps("a"), stamps("b")
    assert.is_true(#sa > 5)
    assert.is_true(sa[#sa] < sb[1], "the two jobs overlapped")
    assert.is_true(helpers.sh_ok("kill -TERM " .. number_in("rl-b")))
    assert.matches("__EXIT:3", b:read("a"))
    b:close()
    assert.matches("__EXIT:137", a:read("a"))
    a:close()
  end)

  it("run: a job that honours TERM gets it at once", function()
    local a, rpid, jpid = start_a("run --ttl 6 job", true)
    core.sleep(0.3)
    local ran_on = kill_and_watch(rpid, jpid, "lock:{job}")
    assert.is_true(ran_on < 2, "TERM came " .. ran_on .. " s late")
    assert.matches("a%-term", read("log"))
    a:close()
  end)

  it("elect: the killed leader's job is gone before the next leader's starts", function()
    local a, rpid, jpid = start_a("elect --ttl 3 --grace 30 sched") -- the first leader
    local b = start("rl-b", "elect --ttl 3 sched -- " .. job("b", "job-b", true))
    core.sleep(0.5)
    local ran_on = kill_and_watch(rpid, jpid, "lock:{sched}")
    assert.is_true(ran_on < 3, "the job ran on " .. ran_on .. " s, past the TTL")
    assert.is_truthy(number_in("job-b"), "the next leader never ran its job")
    assert.is_truthy(helpers.eventually(5, function() return #stamps("b") >= 3 end))
    local sa, sb = stamps("a"), stamps("b")
    assert.is_true(sa[#sa] < sb[1], "the two leaders' jobs overlapped")
    assert.is_true(helpers.sh_ok("kill -TERM " .. number_in("rl-b")))
    b:read("a")
    b:close()
    a:close()
  end)

  it("signals sent to redislock itself reach the job, and its keeper killed takes the job along (Linux)", function()
    local a, rpid = start_a("run --ttl 10 job", true)
    assert.is_true(helpers.sh_ok("kill -TERM " .. rpid))
    assert.matches("__EXIT:3", a:read("a"))
    a:close()
    assert.are.equal(0, raw:command("EXISTS", "lock:{job}"))
    if not helpers.run("uname -s"):find("Linux") then return end
    os.remove(file("job-a"))
    local jpid
    a, rpid, jpid = start_a("run --ttl 10 job")
    local keeper = tonumber((helpers.run("ps -o ppid= -p " .. jpid)))
    assert.is_truthy(keeper)
    assert.are_not.equal(rpid, keeper)
    local t0 = core.now()
    assert.is_true(helpers.sh_ok("kill -KILL " .. keeper))
    assert.is_truthy(helpers.eventually(5, function() return not alive(jpid) end))
    assert.is_true(core.now() - t0 < 2)
    assert.matches("__EXIT:137", a:read("a"))
    a:close()
  end)
end)
