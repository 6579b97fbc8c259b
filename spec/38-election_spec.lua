-- SPDX-License-Identifier: MIT
-- Leader election (redislock/election.lua): one leader at a time among
-- several OS processes (a counter and the terms they pushed), a leader
-- that is SIGKILLed or SIGSTOPped replaced within its TTL and the wait
-- bound, a resign that hands over at once, observers that hear every
-- change in order, and bad input. Both transports run it (the suite's two
-- passes); Sentinel, Cluster and Redlock have theirs in their own specs.
local core = require("redislock.core")
local helpers = require("spec.helpers")

-- How late a campaigner that waits may take over once a leader's TTL ran
-- out: its block ends by the TTL it was told and a second at most
-- (wait.lua's FAIR_STEP), plus room for a loaded machine.
local WAIT_BOUND = 1.5

describe("an election", function()
  local srv, raw, c

  helpers.client_each(function(s, r, client) srv, raw, c = s, r, client end)

  local function worker(...)
    return helpers.spawn(helpers.spec_dir .. "workers/campaign.lua", srv.port, ...)
  end

  -- A worker's output, checked: it succeeded.
  local function output(p)
    local out, ok = p.wait()
    assert.is_true(ok, out)
    return out
  end

  it("refuses bad input with clear messages", function()
    local e = c:election("jobs")
    local cases = {
      { function() c:election("") end, "name must not be empty" },
      { function() c:election(42) end, "name must be a string, got number" },
      { function() e:campaign("a", 0) end, "bad argument #2 to 'campaign' (ttl must be" },
      { function() e:campaign("a", -1) end, "bad argument #2 to 'campaign' (ttl must be" },
      { function() e:with_leadership("a", 0, print) end, "bad argument #2 to 'with_leadership' (ttl must be" },
      { function() e:campaign(nil, 5) end, "value must be a string, got nil" },
      { function() e:campaign(("x"):rep(1025), 5) end, "value must be at most 1024 bytes, got 1025" },
      { function() e:campaign("a", 5, { renew = false }) end, "option 'renew' is not available" },
      { function() e:campaign("a", 5, { max_hold = 3 }) end, "option 'max_hold' is not available" },
      { function() e:campaign("a", 5, { colour = 1 }) end, "unknown option" },
      { function() e:with_leadership("a", 5, 42) end, "function expected, got number" },
      { function() e:observe(print, { late = 0 }) end, "option 'late'" },
      { function() e:observe(print, { late = 0.01 }) end, "option 'late' must be at least 0.05 s" },
      { function() e:observe(print, { when = 1 }) end, "unknown option" },
      { function() e.leader() end, "call it with ':'" },
      { function() e:every(1, print) end, "'every' runs under OpenResty" },
    }
    for _, case in ipairs(cases) do
      local ok, err = pcall(case[1])
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(case[2], 1, true), tostring(err))
    end
    -- Campaigning twice on one client for one name (through any election
    -- object of that name) is refused.
    local lead = assert(e:campaign("a", 5))
    for _, again in ipairs({ e, c:election("jobs") }) do
      local ok, err = pcall(again.campaign, again, "b", 5)
      assert.is_false(ok)
      assert.is_truthy(err:find("this client already leads election \"jobs\" (term " .. lead.term .. "); resign first",
                                1, true), err)
    end
    assert.is_true(lead:resign())
    assert.is_truthy(e:campaign("b", 5)):resign()
  end)

  it("tells who leads, with the term and value, through a proclaim and a resign", function()
    local e = c:election("jobs")
    assert.is_false(e:leader())
    local lead = assert(e:campaign("node-a", 5))
    assert.are.equal("node-a", lead.value)
    assert.is_true(lead.term >= 1)
    local l = assert(e:leader())
    assert.are.equal("node-a", l.value)
    assert.are.equal(lead.term, l.term)
    assert.is_true(l.ttl > 4 and l.ttl <= 5)
    assert.are.equal(core.getpid(), l.holder.pid)
    assert.is_true(lead:proclaim("node-a at :8080"))
    l = assert(e:leader())
    assert.are.equal("node-a at :8080", l.value)
    assert.are.equal(lead.term, l.term) -- the same term
    assert.is_true(lead:check(true))
    assert.is_false(lead:lost())
    -- Writes guarded by the term, and by the lead itself.
    assert.is_true((lead:fenced():set("report", "a")))
    assert.is_true((lead:owned():set("note", "a")))
    assert.is_true(lead:resign())
    -- A resignation is no loss, and says so under the same code.
    assert.are.equal('lost: the leadership of "election:jobs" was already resigned', lead:lost())
    local gone, why = lead:check(true)
    assert.is_nil(gone)
    assert.are.equal(lead:lost(), why)
    assert.is_true(lead:resign()) -- again: harmless
    assert.is_false(e:leader())
    local other = srv:client()
    local next_lead = assert(other:election("jobs"):campaign("node-b", 5))
    assert.is_true(next_lead.term > lead.term)
    assert.are.equal("node-b", assert(e:leader()).value)
    -- The old leader's writes are refused: its term is below, it leads no more.
    local ok, err = lead:fenced():set("report", "stale")
    assert.is_false(ok)
    assert.are.equal(lead:lost(), err) -- resigned: not even sent
    assert.is_true((next_lead:fenced():set("report", "b")))
    assert.are.equal("b", raw:command("GET", "report"))
    assert.is_true(next_lead:resign())
    other:close()
  end)

  it("renews a leadership while held, through a proclaim", function()
    local lead = assert(c:election("jobs"):campaign("a", 0.6))
    core.sleep(0.5)
    assert.is_true(lead:proclaim("b")) -- the renewal goes on with the new value
    core.sleep(1)
    assert.is_true(lead:check(true))
    assert.are.equal("b", assert(c:election("jobs"):leader()).value)
    assert.is_true(lead:resign())
  end)

  it("refuses a deposed leader's fenced write: its term is below the next leader's", function()
    local e = c:election("jobs")
    local old = assert(e:campaign("a", 5))
    assert.is_true(c:force_release("election:jobs")) -- an operator deposes it; it does not know yet
    local other = srv:client()
    local new = assert(other:election("jobs"):campaign("b", 5))
    assert.is_true((new:fenced():set("report", "b")))
    local ok, err = old:fenced():set("report", "a")
    assert.is_false(ok)
    assert.matches("^stale: ", err)
    assert.are.equal("b", raw:command("GET", "report"))
    assert.is_true(new:resign())
    other:close()
  end)

  it("says busy when another leads and the wait runs out", function()
    local other = srv:client()
    local lead = assert(other:election("jobs"):campaign("b", 5))
    local got, err = c:election("jobs"):campaign("a", 5, { wait = 0.2 })
    assert.is_nil(got)
    assert.is_truthy(err:find('^busy: election "jobs" still has another leader after waiting'), err)
    assert.is_true(lead:resign())
    other:close()
  end)

  it("keeps one leader at a time among five processes, terms growing", function()
    local start_at = core.now() + 0.5
    local procs, rounds = {}, 20
    for i = 1, 5 do procs[i] = worker("jobs", "loop", rounds, start_at) end
    assert.are.equal(0, helpers.overlaps(procs))
    assert.are.equal(tostring(5 * rounds), raw:command("GET", "counter"))
    local terms = raw:command("LRANGE", "terms", 0, -1)
    assert.are.equal(5 * rounds, #terms)
    for i = 2, #terms do
      assert.is_true(tonumber(terms[i]) > tonumber(terms[i - 1]), "term " .. terms[i] .. " after " .. terms[i - 1])
    end
  end)

  -- "leads <term> <when>" of a worker's output.
  local function leads(out)
    local term, at = out:match("leads (%d+) ([%d.]+)")
    assert.is_truthy(term, out)
    return tonumber(term), tonumber(at)
  end

  it("lets another lead within the TTL and the wait bound once the leader is SIGKILLed", function()
    local first = worker("jobs", "lead", "a", 1)
    helpers.pid_of(raw, 1)
    assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{election:jobs}") == 1 end))
    local second = worker("jobs", "lead", "b", 1, 0.1)
    helpers.pid_of(raw, 2)
    core.sleep(0.5) -- it campaigns, and waits
    local killed = core.now()
    assert.is_true(helpers.sh_ok("kill -KILL " .. helpers.pid_of(raw, 1)))
    first.wait()
    local term, at = leads(output(second))
    local took = at - killed
    assert.is_true(took <= 1 + WAIT_BOUND, string.format("the next leader came %.3f s after the kill", took))
    assert.is_true(term > 1)
  end)

  it("tells a leader SIGSTOPped past its TTL that it lost, with a term below the new leader's", function()
    local first = worker("jobs", "lead", "a", 1)
    local pid = helpers.pid_of(raw, 1)
    assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{election:jobs}") == 1 end))
    assert.is_true(helpers.sh_ok("kill -STOP " .. pid))
    local stopped = core.now()
    local second = worker("jobs", "lead", "b", 1, 0.1)
    local term2, at2 = leads(output(second))
    assert.is_true(at2 - stopped <= 1 + WAIT_BOUND, string.format("the next leader came %.3f s after", at2 - stopped))
    assert.is_true(helpers.sh_ok("kill -CONT " .. pid))
    local out = output(first)
    local term1 = leads(out)
    local lost_term, why = out:match("lost (%d+) (.*)")
    assert.is_truthy(lost_term, out)
    assert.is_truthy(why:find("^lost: the leadership of \"election:jobs\""), why)
    assert.is_true(term1 < term2, term1 .. " is not below " .. term2)
  end)

  it("hands the lead over at once on a resign", function()
    local first = worker("jobs", "lead", "a", 10, 1)
    helpers.pid_of(raw, 1)
    assert.is_truthy(helpers.eventually(5, function() return raw:command("EXISTS", "lock:{election:jobs}") == 1 end))
    local second = worker("jobs", "lead", "b", 10, 0.1)
    assert.is_truthy(helpers.eventually(5, function() return helpers.blocked(raw) == 1 end), "never blocked")
    local out = output(first)
    local resigned = tonumber(out:match("resigned ([%d.]+)"))
    local term1 = leads(out)
    local term2, at2 = leads(output(second))
    -- At once: not after its block (a second) or the TTL (10 s).
    assert.is_true(at2 - resigned < 0.5, string.format("the next leader came %.3f s after the resign", at2 - resigned))
    assert.is_true(term2 > term1)
  end)

  it("tells observers of every change, in order", function()
    -- Each stops after the nine changes below (or 60 s: it then fails).
    local observers = { worker("jobs", "observe", 60, 9), worker("jobs", "observe", 60, 9) }
    assert.is_truthy(helpers.eventually(5, function()
      return raw:command("ZCARD", "lock:{election:jobs}:observers") == 2
    end), "the observers never registered")
    local other = srv:client()
    local e, e2 = c:election("jobs"), other:election("jobs")
    local function step() core.sleep(0.3) end
    local a = assert(e:campaign("A", 5))
    step()
    assert.is_true(a:proclaim("A2"))
    step()
    assert.is_true(a:resign())
    step()
    local b = assert(e2:campaign("B", 5))
    step()
    assert.is_true(b:resign())
    step()
    local cc = assert(e:campaign("C", 5))
    -- D waits for C: C's resign hands it the lead, with no gap to tell.
    local d_proc = worker("jobs", "lead", "D", 5, 0.3)
    assert.is_truthy(helpers.eventually(5, function() return helpers.blocked(raw) == 3 end), "D never blocked")
    assert.is_true(cc:resign())
    local term_d = leads(output(d_proc))
    step()
    other:close()
    -- "saw none" after each resign with nobody to follow: the resign says
    -- so, so an observer busy meanwhile does not miss it.
    local want = table.concat({ "saw none", "saw A " .. a.term, "saw A2 " .. a.term, "saw none",
                                "saw B " .. b.term, "saw none", "saw C " .. cc.term, "saw D " .. term_d,
                                "saw none", "done" }, "\n")
    for _, p in ipairs(observers) do
      local out = output(p):gsub("\n$", "")
      assert.are.equal(want, out)
    end
  end)
end)
