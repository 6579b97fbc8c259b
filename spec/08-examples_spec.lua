-- SPDX-License-Identifier: MIT
-- The examples the README points to run, and say what they promise.
local helpers = require("spec.helpers")

describe("examples", function()
  local srv

  lazy_setup(function() srv = helpers.start_redis() end)
  lazy_teardown(function() srv:stop() end)

  local function run_example(name, ...)
    local args = { "REDIS_URL=" .. helpers.sh_quote(srv.url), helpers.lua,
                   helpers.sh_quote(helpers.spec_dir .. "../examples/" .. name) }
    for _, a in ipairs({ ... }) do args[#args + 1] = helpers.sh_quote(a) end
    return helpers.run(table.concat(args, " "))
  end

  it("oversell.lua: the locked run sells exactly the stock, the unlocked one more", function()
    local out, ok = run_example("oversell.lua", "4")
    assert.is_true(ok, out)
    local oversold = tonumber(out:match("without a lock: 4 workers sold (%d+) units of 100"))
    assert.is_truthy(oversold, out)
    assert.is_true(oversold > 100, out)
    assert.is_truthy(out:find("with with_lock: 4 workers sold 100 units of 100", 1, true), out)
  end)

  it("primitives.lua: the semaphore's limit, the read-write lock's snapshots and the transfers' total hold", function()
    local out, ok = run_example("primitives.lua")
    assert.is_true(ok, out)
    assert.is_truthy(out:find("semaphore: 30 calls to the upstream, at most 2 at once (limit 2)", 1, true), out)
    assert.is_truthy(out:find("read-write lock: 80 reads during 5 refreshes, 0 saw the cache torn", 1, true), out)
    assert.is_truthy(out:find("multi-key lock: 80 transfers both ways, total 200 (was 200)", 1, true), out)
  end)

  it("election.lua: three nodes lead one after another, terms growing, and the observer hears each", function()
    local out, ok = run_example("election.lua")
    assert.is_true(ok, out)
    local _, leads = out:gsub("observer: node%-%d leads %(term %d+%)", "")
    assert.are.equal(3, leads, out)
    local runs = "ticks: 9, by node%-%d, node%-%d, node%-%d, one leader after another, terms growing: yes"
    assert.is_truthy(out:find(runs), out)
    assert.is_truthy(out:find("the observer heard 3 leaders, in term order: yes", 1, true), out)
  end)

  it("cron.lua: exactly one of the processes runs the nightly job", function()
    local out, ok = run_example("cron.lua")
    assert.is_true(ok, out)
    local _, running = out:gsub("running the nightly reconciliation", "")
    assert.are.equal(1, running, out)
    assert.is_truthy(out:find("it ran once", 1, true), out)
  end)

  it("fenced_job.sh: a shell job's fenced write under the command; a stale one is refused", function()
    local out, ok = helpers.run("cd " .. helpers.sh_quote(helpers.spec_dir .. "..") .. " && REDIS_URL="
                                .. helpers.sh_quote(srv.url) .. " REDISLOCK_LUA=" .. (jit and "luajit" or "lua5.4") -- luacheck: ignore (jit)
                                .. " sh examples/fenced_job.sh")
    assert.is_true(ok, out)
    local f1, f2 = out:match("^run 1: written with fence (%d+)\nrun 2: written with fence (%d+)\n")
    assert.is_truthy(f1, out)
    assert.is_true(tonumber(f2) > tonumber(f1), out)
    assert.are.equal("run 1: written with fence " .. f1 .. "\nrun 2: written with fence " .. f2 .. "\n"
                     .. "a stale job with fence " .. f1 .. ": refused: report:latest accepted fence " .. f2 .. "\n"
                     .. "report:latest says: run 2\n", out)
    -- The same record as lock:fenced()'s: the next holder writes from Lua.
    local client = require("redislock").new({ port = srv.port })
    local lock = assert(client:acquire("report", 5))
    assert.is_true(lock.fence > tonumber(f2))
    assert.is_true((lock:fenced():set("report:latest", "lua")))
    assert.are.equal(tostring(lock.fence), srv:cli("GET", "{report:latest}:fence"))
    assert(lock:release())
    client:close()
  end)

  it("cron.sh: the redislock command runs the nightly job on exactly one of 5 machines", function()
    local out, ok = helpers.run("cd " .. helpers.sh_quote(helpers.spec_dir .. "..") .. " && REDIS_URL="
                                .. helpers.sh_quote(srv.url) .. " REDISLOCK_LUA=" .. (jit and "luajit" or "lua5.4") -- luacheck: ignore (jit)
                                .. " sh examples/cron.sh")
    assert.is_true(ok, out)
    local _, running = out:gsub("running the nightly reconciliation", "")
    assert.are.equal(1, running, out)
    local _, skipped = out:gsub('skipped %(exit 1: redislock: busy: "nightly%-reconcile" is held by another owner', "")
    assert.are.equal(4, skipped, out)
    assert.is_truthy(out:find("the nightly job ran on 1 of 5 machines", 1, true), out)
  end)

  it("fencing.lua: the stale holder's write is refused", function()
    local out, ok = run_example("fencing.lua")
    assert.is_true(ok, out)
    local a = out:match("A holds the lock with fence (%d+),")
    local b = out:match("B holds the lock with fence (%d+)\n")
    assert.is_truthy(a and b, out)
    assert.is_true(tonumber(b) > tonumber(a), out)
    assert.is_truthy(out:find("B writes with fence " .. b .. ": accepted", 1, true), out)
    assert.is_truthy(out:find("A writes with fence " .. a .. ': refused (stale: "fencing:row" accepted fence ' .. b
                              .. " already; this lock's is " .. a .. ")", 1, true), out)
    assert.is_truthy(out:find('A\'s lock:\tnil\tlost: "fencing" is no longer ours (its TTL ran out)', 1, true), out)
    assert.is_truthy(out:find("the row says: B", 1, true), out)
  end)

  it("basic.lua: the tour runs to the end", function()
    local out, ok = run_example("basic.lua")
    assert.is_true(ok, out)
    assert.is_truthy(out:find("again:      nil, busy:", 1, true), out)
    assert.is_truthy(out:find("lock released: true", 1, true), out)
  end)
end)
