-- SPDX-License-Identifier: MIT
-- Least privilege (README, "A Redis user of its own (ACL)"): the user the
-- README's own ACL SETUSER lines make (read from the README, so the two
-- cannot drift) runs every primitive, waiting in every mode, renewal, WAIT
-- for a replica, inspect and force_release, and guarded writes, in plain Lua
-- and under OpenResty, with nothing refused (the server's ACL LOG stays
-- empty). A user without rights to the lock keys gets redis: NOPERM, never
-- busy or a wait; two applications with their own prefixes and users cannot
-- touch each other's locks.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")

local PASSWORD = "s3cret"

-- The README's "redis-cli [-p PORT] ACL SETUSER ..." lines, in order, as
-- lists of arguments (a trailing comment and the shell's single quotes
-- dropped, the password ours): the lock client's user, its guarded writes,
-- behind Sentinel on the data nodes, on the sentinels, in a cluster.
local README = {}
do
  local readme = assert(io.open(helpers.spec_dir .. "../README.md")):read("a")
  local section = assert(readme:match("\n## A Redis user of its own %(ACL%)\n(.-)\n## "), "the README's ACL section")
  for line in section:gmatch("\nredis%-cli [^\n]-(ACL SETUSER [^\n#]+)") do
    local words = {}
    for word in line:gmatch("%S+") do
      word = word:gsub("^'(.*)'$", "%1")
      words[#words + 1] = word == ">CHANGE-ME" and ">" .. PASSWORD or word
    end
    README[#README + 1] = words
  end
  assert(#README == 5, "five ACL SETUSER lines expected in the README's ACL section, found " .. #README)
end
local BASE, GUARDED, SENTINEL_NODES, SENTINELS, CLUSTER_NODES = 1, 2, 3, 4, 5

-- Runs ACL SETUSER words on the server (a Server); asserts OK.
local function setuser(srv, words)
  local unpack = table.unpack or unpack -- luacheck: ignore (LuaJIT's global)
  assert.are.equal("OK", srv:cli(unpack(words)))
end

-- The README's lock client's line (ACL SETUSER words) for another user,
-- with pattern for its keys instead of ~lock:*: every right the library
-- needs, on other keys.
local function base_as(name, pattern)
  local words, keys = {}, 0
  for i, word in ipairs(README[BASE]) do
    if i == 3 then word = name end
    if word == "~lock:*" then word, keys = pattern, keys + 1 end
    words[i] = word
  end
  assert(README[BASE][3] == "locker" and keys == 1, "the README's line: ACL SETUSER locker ... '~lock:*' ...")
  return words
end

-- What the server's ACL LOG holds now (empty: nothing was refused).
local function refused(srv)
  return srv:cli("ACL", "LOG")
end

describe("the README's ACL user", function()
  local srv, replica, client

  lazy_setup(function()
    srv, replica = helpers.start_with_replica()
    setuser(srv, README[BASE])
    setuser(srv, README[GUARDED])
    client = srv:client({ username = "locker", password = PASSWORD, timeout = 2 })
    require("spec.support.failover").synced(srv, replica) -- for WAIT
  end)
  lazy_teardown(function()
    if client then client:close() end
    if replica then replica:stop() end
    if srv then srv:stop() end
  end)

  it("runs every primitive, every wait mode, renewal, WAIT, inspect, force_release and guarded writes", function()
    assert.are.equal("OK", srv:cli("ACL", "LOG", "RESET"))
    local lock = assert(client:acquire("acl:k", 5, { replicas = 1, replica_timeout = 2 }))
    assert.is_number(lock.fence)
    assert(lock:extend(5))
    assert(lock:release())
    -- with_lock renews a lock that outlives its TTL.
    assert.are.equal("done", client:with_lock("acl:renewed", 0.3, function(l)
      core.sleep(0.8)
      assert(l:check())
      return "done"
    end))
    local permit = assert(client:semaphore("acl:pool", 2):acquire(5))
    assert(permit:release())
    local rw = client:rwlock("acl:doc")
    assert(assert(rw:read(5)):release())
    assert(assert(rw:write(5)):release())
    assert(assert(client:acquire({ "acl:a", "acl:b" }, 5)):release())
    for _, opts in ipairs({ { wait_mode = "notify" }, { wait_mode = "poll" }, { fair = true } }) do
      assert(client:acquire("acl:w", 0.3, { renew = false }))
      opts.wait = 3
      local waited = assert(client:acquire("acl:w", 5, opts))
      assert(waited:release())
    end
    local held = assert(client:acquire("acl:i", 5))
    local info = assert(client:inspect("acl:i"))
    assert.is_true(info.held)
    assert.is_true(client:force_release("acl:i"))
    assert.is_nil((held:release()))
    -- An election: campaign, who leads, a proclaim, an observer, a resign.
    local election = client:election("acl:e")
    local lead = assert(election:campaign("a", 5))
    assert(lead:proclaim("b"))
    assert.are.equal("b", assert(election:leader()).value)
    -- An observer that hears a proclaim: its block (BLPOP) and what it takes.
    local heard = {}
    assert(election:observe(function(leader)
      heard[#heard + 1] = leader.value
      if #heard == 1 then assert(lead:proclaim("c")) end
      return #heard < 2
    end, { wait = 5 }))
    assert.are.same({ "b", "c" }, heard)
    assert(lead:resign())
    -- Guarded writes, with the README's second line.
    local g = assert(client:acquire("acl:g", 5))
    assert.is_true((g:fenced():set("report:1", "r")))
    assert.is_true((g:fenced():hset("report:{2}:doc", "f", "v")))
    assert.is_true((g:fenced():incr("report:n")))
    assert.is_true((g:owned():set("lock:{acl:g}:note", "n")))
    assert(g:release())
    assert.are.equal("", refused(srv))
  end)

  it("answers redis: NOPERM, not busy nor a wait, where a user has no rights to the lock keys", function()
    setuser(srv, base_as("stranger", "~other:*")) -- every command, other keys
    local c = srv:client({ username = "stranger", password = PASSWORD, timeout = 2 })
    local t0 = core.now()
    local lock, err = c:acquire("acl:k", 5, { wait = 5 })
    assert.is_nil(lock)
    assert.matches("^redis: .*NOPERM", err)
    assert.is_true(core.now() - t0 < 1, "it waited")
    local ok, raised = pcall(c.with_lock, c, "acl:k", 5, function() end)
    assert.is_false(ok)
    assert.matches("^redis: .*NOPERM", tostring(raised))
    c:close()
  end)

  it("keeps two applications with their own prefixes and users apart", function()
    for _, app in ipairs({ "app1", "app2" }) do setuser(srv, base_as(app, "~" .. app .. ":*")) end
    local app1 = srv:client({ username = "app1", password = PASSWORD, prefix = "app1:" })
    local app2 = srv:client({ username = "app2", password = PASSWORD, prefix = "app2:" })
    local mine = assert(app1:acquire("job", 5))
    local theirs = assert(app2:acquire("job", 5)) -- the same name, another prefix: another lock
    -- app1 posing as app2 (its prefix) is refused, and so is breaking app2's lock.
    local posing = srv:client({ username = "app1", password = PASSWORD, prefix = "app2:" })
    local _, err = posing:acquire("job", 5)
    assert.matches("^redis: .*NOPERM", err)
    _, err = posing:force_release("job")
    assert.matches("^redis: .*NOPERM", err)
    assert.are.equal(theirs.token, srv:cli("GET", "app2:{job}"))
    assert(mine:release())
    assert(theirs:release())
    for _, c in ipairs({ app1, app2, posing }) do c:close() end
  end)
end)

describe("the README's ACL users behind Sentinel and in a cluster", function()
  local g, cl

  lazy_setup(function()
    g = helpers.start_sentinels()
    for _, n in ipairs(g.nodes) do
      setuser(n, README[BASE])
      setuser(n, README[SENTINEL_NODES])
    end
    for _, s in ipairs(g.sentinels) do setuser(s, README[SENTINELS]) end
    cl = helpers.start_cluster({ masters = 3, replicas = 0 })
    for _, n in ipairs(cl.nodes) do
      setuser(n, README[BASE])
      setuser(n, README[CLUSTER_NODES])
    end
  end)
  lazy_teardown(function()
    if cl then cl:stop() end
    if g then g:stop() end
  end)

  -- A round of the primitives on client, waiting included; asserts nothing
  -- was refused on nodes.
  local function round(client, nodes)
    for _, n in ipairs(nodes) do assert.are.equal("OK", n:cli("ACL", "LOG", "RESET")) end
    assert(assert(client:acquire("acl:s", 5)):release())
    assert.are.equal("ok", client:with_lock("acl:renewed", 0.3, function() core.sleep(0.5) return "ok" end))
    assert(assert(client:semaphore("acl:pool", 2):acquire(5)):release())
    assert(assert(client:rwlock("acl:doc"):write(5)):release())
    local lead = assert(client:election("acl:e"):campaign("a", 5))
    assert.are.equal("a", assert(client:election("acl:e"):leader()).value)
    assert(lead:resign())
    assert(client:acquire("acl:w", 0.3, { renew = false }))
    assert(assert(client:acquire("acl:w", 5, { wait = 3 })):release())
    for _, n in ipairs(nodes) do assert.are.equal("", refused(n)) end
  end

  it("run the primitives behind Sentinel with the sentinels' own user", function()
    local client = require("redislock").new({ sentinels = g.addrs, master = g.name, username = "locker",
                                              password = PASSWORD, sentinel_username = "watcher",
                                              sentinel_password = PASSWORD, timeout = 2 })
    local nodes = { g:master() }
    for _, s in ipairs(g.sentinels) do nodes[#nodes + 1] = s end
    round(client, nodes)
    client:close()
  end)

  it("run the primitives in a cluster", function()
    local client = require("redislock").new({ cluster = cl.seeds, username = "locker", password = PASSWORD,
                                              timeout = 2 })
    round(client, cl.nodes)
    client:close()
  end)
end)

describe("the README's ACL user under OpenResty", function()
  if helpers.no_nginx(pending) then return end

  local srv, nginx

  lazy_setup(function()
    srv = helpers.start_redis()
    setuser(srv, README[BASE])
    setuser(srv, README[GUARDED])
    nginx = helpers.start_nginx({
      workers = 1,
      server = {
        'set $redis_url "redis://locker:' .. PASSWORD .. "@127.0.0.1:" .. srv.port .. '";',
        helpers.location("/with_lock", "with_lock"),
        helpers.location("/acquire", "acquire"),
        helpers.location("/holds", "holds"),
        helpers.location("/guarded", "guarded"),
      },
    })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
    if srv then srv:stop() end
  end)

  it("runs with_lock with renewal, the primitives, waiting and guarded writes over cosockets", function()
    assert.are.equal("OK", srv:cli("ACL", "LOG", "RESET"))
    local status, body = http.request(nginx.port, "GET", "/with_lock?key=acl:ngx&ttl=0.3&hold=0.8")
    assert.are.equal(200, status, body)
    status, body = http.request(nginx.port, "GET", "/holds?key=acl:holds")
    assert.are.equal(200, status, body)
    assert.matches("^lock=%d+ permit=%d+ read=%d+ write=%d+ multi=%d+", body)
    -- A waiter in each mode behind a holder that lets go.
    for i, how in ipairs({ "mode=notify", "mode=poll", "fair=1" }) do
      local key = "acl:wait" .. i
      local holder = http.start(nginx.port, "GET", "/with_lock?key=" .. key .. "&ttl=5&hold=0.3")
      assert(helpers.eventually(5, function() return srv:cli("EXISTS", "lock:{" .. key .. "}") == "1" end))
      status, body = http.request(nginx.port, "GET", "/acquire?key=" .. key .. "&wait=5&" .. how)
      assert.are.equal(200, status, how .. ": " .. body)
      assert.are.equal(200, (holder:finish()))
    end
    -- A guarded write (fenced; the handler waits for its go key, set at once).
    assert.are.equal("OK", srv:cli("SET", "report:ngx:go", "1"))
    status, body = http.request(nginx.port, "GET", "/guarded?key=acl:guard&ttl=5&form=fenced&rkey=report:ngx")
    assert.are.equal(200, status, body)
    assert.are.equal("written", body:gsub("\n$", ""))
    assert.are.equal("", refused(srv))
  end)
end)
