-- SPDX-License-Identifier: MIT
-- The `redislock` command (bin/redislock), run as a child process the way
-- cron runs it, against a private redis-server: exit statuses (passed
-- through, conflict, -E, a signal), renewal past the TTL, a lost lock
-- (SIGTERM, then SIGKILL after the grace), signals passed on and the lock
-- released after, the environment, status and break, bad usage, Redis down.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local redislock = require("redislock")

local COMMAND = helpers.sh_quote(helpers.spec_dir .. "../bin/redislock")
-- The commands run under the lock start with this: under `make asan` the
-- sanitizers are preloaded for redislock (built for them), not for sh.
local SH = "env -u LD_PRELOAD sh"

describe("the redislock command", function()
  local srv, raw, client, tmp

  helpers.redis_for(function(s, r)
    srv, raw = s, r
    client = redislock.new({ port = srv.port })
    tmp = helpers.run("mktemp -d"):gsub("%s+$", "")
  end, { flush = true })
  lazy_teardown(function()
    if client then client:close() end
    if tmp then os.execute("rm -rf " .. helpers.sh_quote(tmp)) end
  end)

  -- Runs `redislock <words>` (a shell fragment) against the server; returns
  -- its output (stdout and stderr), its exit status and the seconds it took.
  local function redislock_cmd(words, url)
    local t0 = core.now()
    local out, _, code = helpers.run("REDIS_URL=" .. helpers.sh_quote(url or srv.url) .. " " .. helpers.lua .. " "
                                     .. COMMAND .. " " .. words)
    return out, code, core.now() - t0
  end
  -- Starts it in the background (against url, or the spec's server);
  -- finish(handle) waits for it and returns its output and exit status.
  local function redislock_bg(words, url)
    return { wait = assert(io.popen("REDIS_URL=" .. helpers.sh_quote(url or srv.url) .. " " .. helpers.lua .. " "
                                    .. COMMAND .. " " .. words .. " 2>&1; echo __EXIT:$?")) }
  end
  local function finish(p)
    local out = p.wait:read("*a")
    p.wait:close()
    return out:gsub("__EXIT:%d+\n?$", ""), tonumber(out:match("__EXIT:(%d+)"))
  end
  local function file(name) return tmp .. "/" .. name end

  it("passes the command's exit status through, and 128 + N for a signal", function()
    local out, code = redislock_cmd("run job -- " .. SH .. " -c 'exit 7'")
    assert.are.equal(7, code, out)
    out, code = redislock_cmd("run job " .. SH .. " -c 'kill -TERM $$'")
    assert.are.equal(128 + 15, code, out)
    out, code = redislock_cmd("run job env -u LD_PRELOAD true")
    assert.are.equal(0, code, out)
    assert.are.equal(0, raw:command("EXISTS", "lock:{job}"))
  end)

  it("gives the command REDISLOCK_KEY, REDISLOCK_TOKEN and REDISLOCK_FENCE, and holds the lock meanwhile", function()
    local out, code = redislock_cmd("run job -- " .. SH .. " -c " .. helpers.sh_quote(
      'echo "key=$REDISLOCK_KEY fence=$REDISLOCK_FENCE token=$REDISLOCK_TOKEN held=$(redis-cli -p ' .. srv.port
      .. ' GET "lock:{job}")"'))
    assert.are.equal(0, code, out)
    local key, fence, token, held = out:match("key=(%S+) fence=(%d+) token=(%S+) held=(%S+)")
    assert.are.equal("job", key, out)
    assert.is_true(tonumber(fence) >= 1)
    assert.are.equal(token, held)
    assert.matches("^%x+/[^/]+/%d+/%d+$", token)
  end)

  it("exits 1 (or -E's) without starting the command when the lock is held elsewhere", function()
    local lock = assert(client:acquire("job", 10))
    local out, code = redislock_cmd("run job env -u LD_PRELOAD touch " .. helpers.sh_quote(file("ran")))
    assert.are.equal(1, code, out)
    assert.matches('^redislock: busy: "job" is held by another owner', out)
    out, code = redislock_cmd("run -E 42 job env -u LD_PRELOAD touch " .. helpers.sh_quote(file("ran")))
    assert.are.equal(42, code, out)
    assert.is_nil(io.open(file("ran")))
    assert(lock:release())
  end)

  it("waits with -w, and runs once the holder lets go", function()
    local lock = assert(client:acquire("job", 0.6))
    local out, code, took = redislock_cmd("run -w 3 job env -u LD_PRELOAD true")
    assert.are.equal(0, code, out)
    assert.is_true(took >= 0.4, "took " .. took)
    assert.is_nil(lock:release())
  end)

  it("renews the lock while a command runs past its TTL, and releases it after", function()
    local out, code, took = redislock_cmd("run --ttl 0.5 job " .. SH .. " -c 'sleep 1.5; echo done'")
    assert.are.equal(0, code, out)
    assert.matches("done", out)
    assert.is_true(took >= 1.5)
    assert.are.equal(0, raw:command("EXISTS", "lock:{job}"))
  end)

  it("on a lost lock sends TERM, then KILL after the grace, and exits 75", function()
    -- The command ignores TERM: KILL ends it.
    local p = redislock_bg("run --ttl 0.6 --grace 0.5 job " .. SH .. " -c " .. helpers.sh_quote(
      "trap '' TERM; echo started; while :; do sleep 0.05; done"))
    assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{job}") == 1 end))
    local t0 = core.now()
    raw:command("SET", "lock:{job}", "someone else", "PX", 10000)
    local out, code = finish(p)
    assert.are.equal(75, code, out)
    assert.matches("redislock: lost: \"job\" is no longer ours %(another owner holds it now", out)
    assert.is_true(core.now() - t0 < 5, "it took " .. (core.now() - t0))
    -- The command takes TERM: it ends on it.
    raw:command("DEL", "lock:{job}")
    p = redislock_bg("run --ttl 0.6 job " .. SH .. " -c " .. helpers.sh_quote(
      "trap 'echo got-term; exit 3' TERM; while :; do sleep 0.05; done"))
    assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{job}") == 1 end))
    raw:command("DEL", "lock:{job}")
    out, code = finish(p)
    assert.are.equal(75, code, out)
    assert.matches("got%-term", out)
  end)

  it("ends the command and exits 75 when Redis goes away and the TTL runs out", function()
    local gone = helpers.start_redis()
    local p = redislock_bg("run --ttl 0.6 --grace 0.3 job " .. SH .. " -c " .. helpers.sh_quote(
      "trap 'echo got-term; exit 3' TERM; while :; do sleep 0.05; done"), gone.url)
    local raw2 = gone:raw()
    assert.is_truthy(helpers.eventually(5, function() return raw2:command("EXISTS", "lock:{job}") == 1 end))
    raw2:close()
    local t0 = core.now()
    gone:stop()
    local out, code = finish(p)
    assert.are.equal(75, code, out)
    assert.matches("could not renew it before its TTL ran out", out)
    assert.matches("got%-term", out)
    assert.is_true(core.now() - t0 < 3, "it took " .. (core.now() - t0))
  end)

  it("passes TERM, INT, HUP and QUIT on to the command, and releases the lock after it ends", function()
    for _, sig in ipairs({ "TERM", "INT", "HUP", "QUIT" }) do
      local pidfile = file("pid-" .. sig)
      local p = redislock_bg("run job " .. SH .. " -c " .. helpers.sh_quote(
        "echo $PPID > " .. pidfile .. "; trap 'echo got-" .. sig .. "; exit 5' " .. sig
        .. "; while :; do sleep 0.05; done"))
      local pid = helpers.eventually(5, function()
        local f = io.open(pidfile)
        local v = f and f:read("*n")
        if f then f:close() end
        return v
      end)
      assert.is_truthy(pid, "the command never started")
      assert.is_true(helpers.sh_ok("kill -" .. sig .. " " .. pid))
      local out, code = finish(p)
      assert.are.equal(5, code, sig .. ": " .. out)
      assert.matches("got%-" .. sig, out)
      assert.are.equal(0, raw:command("EXISTS", "lock:{job}"))
    end
  end)

  it("status tells who holds a lock; break releases it and wakes a waiter, and fences keep growing", function()
    local other = redislock.new({ port = srv.port, label = "nightly-job" })
    local lock = assert(other:acquire("job", 30))
    local out, code = redislock_cmd("status job")
    assert.are.equal(0, code, out)
    assert.matches("job held", out)
    assert.matches("fence: none", out) -- taken at its first try: the server keeps no holder's fence
    assert.matches("holder: host [^,]+, pid " .. core.getpid() .. ", since %d+%-%d+%-%d+T[%d:]+Z, label nightly%-job",
                   out)
    local waiter = redislock_bg("run -w 10 job -- " .. SH .. " -c 'echo fence $REDISLOCK_FENCE'")
    assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{job}:waiters") == 1 end))
    local t0 = core.now()
    out, code = redislock_cmd("break job")
    assert.are.equal(0, code, out)
    assert.matches("job released", out)
    local wout, wcode = finish(waiter)
    assert.are.equal(0, wcode, wout)
    assert.is_true(core.now() - t0 < 1, "the waiter was not woken")
    local waiter_fence = tonumber(wout:match("fence (%d+)"))
    assert.is_truthy(waiter_fence, wout)
    assert.is_true(waiter_fence > lock.fence, waiter_fence .. " > " .. lock.fence)
    out, code = redislock_cmd("status job")
    assert.are.equal(1, code, out)
    assert.matches("job free", out)
    assert.matches("fence: none", out) -- a free lock has no holder, and no fence
    out, code = redislock_cmd("break job")
    assert.are.equal(1, code, out)
    assert.is_nil(lock:release())
    other:close()
  end)

  it("refuses bad usage with 64 and a line on stderr, and prints help", function()
    for _, words in ipairs({ "", "run", "run job", "run --ttl x job true", "run --bogus job true", "nope job",
                             "status", "status a b", "status --ttl 5 job", "run --sentinels h:1 job true",
                             "run -E 300 job true", "run --wait -1 job true", "run --url bad://x job true" }) do
      local out, code = redislock_cmd(words)
      assert.are.equal(64, code, words .. ": " .. out)
      assert.matches("^redislock: [^\n]+\nTry 'redislock %-%-help'%.\n$", out)
    end
    -- What each says: in the command's words, not the library's.
    for words, said in pairs({
      ["run -- echo hi"] = "'--' goes after KEY (run [options] KEY -- COMMAND ...)",
      ["run '' -- true"] = "KEY must not be empty",
      ["break ''"] = "KEY must not be empty",
      ["run --ttl 1e300 job true"] = "--ttl must be a number of seconds above 0, at most 9007199254740, got '1e300'",
      ["run --timeout 100000 job true"] =
        "--timeout must be a number of seconds above 0, at most 86400, got '100000'",
      ["--bogus"] =
        "unknown option '--bogus' (options go after the subcommand: redislock run|elect|status|break [options] KEY)",
      ["elect -- echo hi"] = "'--' goes after NAME (elect [options] NAME -- COMMAND ...)",
      ["elect '' true"] = "NAME must not be empty",
      ["elect jobs"] = "elect needs a COMMAND after the NAME",
      ["run --again job true"] = "'run' takes no option '--again'",
      ["elect --fair jobs true"] = "'elect' takes no option '--fair'",
      ["status --value v job"] = "'status' takes no option '--value'",
      ["run --ttl 5 --ttl 6 job true"] = "option '--ttl' is given twice",
      ["run -w 1 --wait 2 job true"] = "option '--wait' is given twice",
      ["status --url redis://127.0.0.1/2000000 job"] =
        "the URL's database must be a whole number in 0..1000000, got 2000000",
    }) do
      local out, code = redislock_cmd(words)
      assert.are.equal(64, code, words .. ": " .. out)
      assert.are.equal("redislock: " .. said .. "\nTry 'redislock --help'.\n", out)
    end
    assert.are.equal(0, raw:command("EXISTS", "lock:{echo}")) -- "run -- echo hi" took no lock named "echo"
    local out, code = redislock_cmd("--help")
    assert.are.equal(0, code)
    assert.matches("usage: redislock run", out)
  end)

  it("prints the usage for a subcommand's --help or -h, and blames an option's bad number, hex too", function()
    for _, words in ipairs({ "run --help", "elect --help", "status --help", "break --help", "elect -h", "run -h",
                             "run --ttl 5 --help" }) do
      local out, code = redislock_cmd(words)
      assert.are.equal(0, code, words .. ": " .. out)
      assert.matches("^usage: redislock run", out, words)
    end
    for words, said in pairs({
      ["elect -w n -- true"] = "option '-w' needs a number of seconds, got 'n'",
      ["run --ttl 0x10 job true"] = "option '--ttl' needs a number of seconds, got '0x10'",
      ["run --grace=nan job true"] = "option '--grace' needs a number of seconds, got 'nan'",
      ["run -E 0x2 job true"] = "option '-E' needs a whole number in 0..255, got '0x2'",
    }) do
      local out, code = redislock_cmd(words)
      assert.are.equal(64, code, words .. ": " .. out)
      assert.are.equal("redislock: " .. said .. "\nTry 'redislock --help'.\n", out)
    end
    -- after KEY, --help is the command's own argument
    local out, code = redislock_cmd("run job -- " .. SH .. " -c 'echo \"$0 $1\"' --help")
    assert.are.equal(0, code, out)
    assert.matches("%-%-help", out)
  end)

  it("elect runs the command while it leads, with REDISLOCK_TERM and REDISLOCK_VALUE, and passes its status", function()
    local out, code = redislock_cmd("elect --value node-a jobs -- " .. SH .. " -c " .. helpers.sh_quote(
      'echo "election=$REDISLOCK_ELECTION term=$REDISLOCK_TERM fence=$REDISLOCK_FENCE value=$REDISLOCK_VALUE '
      .. 'held=$(redis-cli -p ' .. srv.port .. ' GET "lock:{election:jobs}")"; exit 5'))
    assert.are.equal(5, code, out)
    local election, term, fence, value, held = out:match("election=(%S+) term=(%d+) fence=(%d+) value=(%S+) held=(.+)")
    assert.are.equal("jobs", election, out)
    assert.are.equal(term, fence)
    assert.are.equal("node-a", value)
    assert.matches(" node%-a\n?$", held)
    assert.are.equal(0, raw:command("EXISTS", "lock:{election:jobs}")) -- resigned
    -- Another leads: busy within -w, exit 1 (or -E's).
    local leader = assert(client:election("jobs"):campaign("b", 10))
    out, code = redislock_cmd("elect -w 0.2 -E 9 jobs env -u LD_PRELOAD true")
    assert.are.equal(9, code, out)
    assert.matches("^redislock: busy: election \"jobs\" still has another leader", out)
    assert.is_true(leader:resign())
  end)

  it("elect sends TERM to the command when leadership is lost, and exits 75", function()
    local p = redislock_bg("elect --ttl 1 --grace 1 jobs -- " .. SH .. " -c " .. helpers.sh_quote(
      "trap 'echo got-term; exit 0' TERM; while :; do sleep 0.05; done"))
    assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{election:jobs}") == 1 end))
    core.sleep(0.2)
    assert.is_true(client:force_release("election:jobs"))
    local other = assert(client:election("jobs"):campaign("b", 10))
    local out, code = finish(p)
    assert.are.equal(75, code, out)
    assert.matches("got%-term", out)
    assert.matches("lost: the leadership of \"election:jobs\" is no longer ours", out)
    assert.is_true(other:resign())
  end)

  it("elect --again campaigns again after the command ends, one leader at a time, until a signal", function()
    local log = file("again.log")
    local job = helpers.sh_quote("echo start $$ $REDISLOCK_TERM >> " .. log .. "; sleep 0.3; echo end $$ >> " .. log)
    local procs = {}
    -- A name of its own, so that the kill below reaches these two only.
    local name = "again-" .. core.token():sub(1, 8)
    for i = 1, 2 do procs[i] = redislock_bg("elect --again --ttl 2 " .. name .. " -- " .. SH .. " -c " .. job) end
    assert.is_truthy(helpers.eventually(10, function()
      local f = io.open(log)
      local n = f and select(2, f:read("*a"):gsub("start", "")) or 0
      if f then f:close() end
      return n >= 3
    end), "fewer than 3 runs")
    -- The two commands (not the shells that started them).
    local pattern = "'^[^ ]*lua[^ ]* .*redislock elect --again --ttl 2 " .. name .. "'"
    for pid in helpers.run("pgrep -f " .. pattern):gmatch("%d+") do
      os.execute("kill -TERM " .. pid)
    end
    for _, p in ipairs(procs) do
      local out, code = finish(p)
      assert.is_true(code == 143 or code == 0, out) -- TERM while it waited, or its command's status
    end
    -- One run at a time: every start is followed by its own end.
    local f = assert(io.open(log))
    local lines = {}
    for l in f:lines() do lines[#lines + 1] = l end
    f:close()
    local last_term = 0
    for i = 1, #lines - 1, 2 do
      local pid, term = lines[i]:match("^start (%d+) (%d+)$")
      assert.is_truthy(pid, table.concat(lines, "\n"))
      assert.are.equal("end " .. pid, lines[i + 1], table.concat(lines, "\n"))
      assert.is_true(tonumber(term) > last_term)
      last_term = tonumber(term)
    end
  end)

  it("exits 69 without starting the command when Redis cannot be reached", function()
    local url = "redis://127.0.0.1:" .. helpers.free_port()
    local out, code = redislock_cmd("run job env -u LD_PRELOAD touch " .. helpers.sh_quote(file("down")), url)
    assert.are.equal(69, code, out)
    assert.matches("^redislock: connection: [^\n]+\n$", out)
    assert.is_nil(io.open(file("down")))
    out, code = redislock_cmd("status job", url)
    assert.are.equal(69, code, out)
    out, code = redislock_cmd("run job no-such-command-here")
    assert.are.equal(127, code, out)
    assert.are.equal(0, raw:command("EXISTS", "lock:{job}"))
  end)
end)
