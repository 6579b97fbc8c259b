-- SPDX-License-Identifier: MIT
-- redislock.metrics (issue 57): the figures of a client's holds in
-- Prometheus' text format, read back by a strict parser of that format
-- (and checked by promtool's check metrics too where it is installed) and held against what the spec did: from
-- plain Lua (locks, a busy answer, a wait handed over by another process's
-- release, a lost lease, errors of both codes, a hold held too long), and
-- from two nginx workers under load adding up in one shared dict.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local http = require("spec.support.http")
local metrics_mod = require("redislock.metrics")
local redislock = require("redislock")

-- Parses Prometheus' text format (0.0.4) strictly; raises at the first
-- fault. Returns the families (name -> { type, help, samples = { { name,
-- labels, value } } }) and value(name, labels) -> the sample's value or nil.
local function parse(text)
  assert(text:sub(-1) == "\n", "the text does not end with a new line")
  local families, seen, order = {}, {}, {}
  local current -- the family whose samples come now
  local function family_of(sample)
    for _, suffix in ipairs({ "_bucket", "_sum", "_count" }) do
      local base = sample:match("^(.-)" .. suffix .. "$")
      if base and families[base] and families[base].type == "histogram" then return base end
    end
    return sample
  end
  local n = 0
  for line in text:gmatch("([^\n]*)\n") do
    n = n + 1
    local where = "line " .. n .. ": " .. line
    local kind, name, rest = line:match("^# (%u+) ([%a_:][%w_:]*) (.*)$")
    if kind == "HELP" then
      assert(not (families[name] and families[name].help), "a second HELP, " .. where)
      assert(not rest:find("\\[^\\n]"), "a bad escape in HELP, " .. where)
      families[name] = families[name] or { samples = {} }
      families[name].help = rest
    elseif kind == "TYPE" then
      local f = families[name] or { samples = {} }
      families[name] = f
      assert(not f.type, "a second TYPE, " .. where)
      assert(#f.samples == 0, "TYPE after samples, " .. where)
      assert(({ counter = true, gauge = true, histogram = true, summary = true, untyped = true })[rest],
             "an unknown type, " .. where)
      f.type = rest
      assert(not order[name], "a family twice, " .. where)
      order[name], current = true, name
    else
      assert(not line:find("^#"), "a comment that is neither HELP nor TYPE, " .. where)
      local sname, labels, value = line:match("^([%a_:][%w_:]*)({.*}) (%S+)$")
      if not sname then
        sname, value = line:match("^([%a_:][%w_:]*) (%S+)$")
        labels = "{}"
      end
      assert(sname, "not a sample, " .. where)
      local fname = family_of(sname)
      assert(fname == current, "a sample outside its family's block, " .. where)
      local t, body, pos = {}, labels:sub(2, -2), 1
      while pos <= #body do
        local lname, at = body:match('^([%a_][%w_]*)="()', pos)
        assert(lname, "bad labels, " .. where)
        -- the value: any character but \ and ", or the escapes \\ \" \n
        local chars = {}
        pos = at
        while true do
          local c = body:sub(pos, pos)
          assert(c ~= "", "a label value without its end, " .. where)
          if c == '"' then break end
          if c == "\\" then
            local e = body:sub(pos + 1, pos + 1)
            assert(e == "\\" or e == '"' or e == "n", "a bad escape in a label value, " .. where)
            c, pos = e == "n" and "\n" or e, pos + 1
          end
          chars[#chars + 1] = c
          pos = pos + 1
        end
        assert(t[lname] == nil, "a label twice, " .. where)
        t[lname] = table.concat(chars)
        pos = pos + 1
        if pos <= #body then
          assert(body:sub(pos, pos) == ",", "labels not separated by commas, " .. where)
          pos = pos + 1
        end
      end
      local num = tonumber(value) or ({ ["+Inf"] = math.huge, ["-Inf"] = -math.huge })[value]
      if value == "NaN" then num = 0 / 0 end
      assert(num, "not a number, " .. where)
      local id = sname .. labels
      assert(not seen[id], "a sample twice, " .. where)
      seen[id] = true
      local f = families[fname]
      f.samples[#f.samples + 1] = { name = sname, labels = t, value = num }
    end
  end
  -- Histograms: per label set, buckets by increasing le, counts that never
  -- fall, +Inf last and equal to _count, and a _sum.
  for fname, f in pairs(families) do
    assert(f.type and f.help, fname .. " lacks HELP or TYPE")
    if f.type == "counter" then assert(fname:match("_total$"), fname .. ": a counter's name ends in _total") end
    if f.type == "histogram" then
      local sets = {}
      for _, s in ipairs(f.samples) do
        local key = {}
        for k, v in pairs(s.labels) do if k ~= "le" then key[#key + 1] = k .. "=" .. v end end
        table.sort(key)
        key = table.concat(key, ",")
        sets[key] = sets[key] or { buckets = {} }
        if s.name == fname .. "_bucket" then
          local le = s.labels.le
          assert(le, fname .. "{" .. key .. "}: a bucket without le")
          local b = sets[key].buckets
          b[#b + 1] = { le = le == "+Inf" and math.huge or assert(tonumber(le), "le " .. le), count = s.value }
        elseif s.name == fname .. "_sum" then
          sets[key].sum = s.value
        else
          sets[key].count = s.value
        end
      end
      for key, set in pairs(sets) do
        local b = set.buckets
        assert(#b > 0 and set.sum and set.count, fname .. "{" .. key .. "}: buckets, _sum and _count expected")
        for i = 2, #b do
          assert(b[i].le > b[i - 1].le, fname .. "{" .. key .. "}: le not increasing")
          assert(b[i].count >= b[i - 1].count, fname .. "{" .. key .. "}: a bucket count falls")
        end
        assert(b[#b].le == math.huge, fname .. "{" .. key .. "}: no +Inf bucket last")
        assert(b[#b].count == set.count, fname .. "{" .. key .. "}: +Inf is not _count")
      end
    end
  end
  local function value(name, labels)
    local f = families[family_of(name)]
    for _, s in ipairs(f and f.samples or {}) do
      if s.name == name then
        local same = true
        for k, v in pairs(labels) do if s.labels[k] ~= v then same = false end end
        for k in pairs(s.labels) do if labels[k] == nil then same = false end end
        if same then return s.value end
      end
    end
    return nil
  end
  return families, value
end

-- Raises unless Prometheus' own promtool finds the text well formed, its
-- lint rules kept, where it is installed (Debian's prometheus package has
-- it; tools/deps.sh leaves that server out: the parser above checks the
-- format without it).
local function promtool(text)
  local _, found = helpers.run("command -v promtool")
  if not found then return end
  local file = helpers.tmpdir() .. "/metrics.prom"
  local f = assert(io.open(file, "w"))
  f:write(text)
  f:close()
  local out, ok = helpers.run("promtool check metrics < " .. helpers.sh_quote(file))
  os.execute("rm -rf " .. helpers.sh_quote(file:match("^(.*)/")))
  assert(ok and out == "", "promtool check metrics: " .. out .. "\n" .. text)
end

-- parse's value as n(name, group, more): the sample of name for locks of
-- group, with the more labels.
local function lock_sample(value)
  return function(name, group, more)
    local labels = { kind = "lock", group = group }
    for k, x in pairs(more or {}) do labels[k] = x end
    return value(name, labels)
  end
end

describe("the parser of the spec", function()
  it("refuses what is not the exposition format", function()
    local ok = "# HELP a_total x\n# TYPE a_total counter\na_total{k=\"v\"} 1\n"
    assert.has_no.errors(function() parse(ok) end)
    for _, bad in ipairs({
      "# TYPE a_total counter\n# HELP a_total x\na_total 1", -- no final new line
      "# HELP a_total x\n# TYPE a_total counter\n# TYPE a_total counter\na_total 1\n",
      "# HELP a_total x\n# TYPE a_total counter\na_total{k=\"v\"} 1\na_total{k=\"v\"} 2\n",
      "# HELP a_total x\n# TYPE a_total counter\na_total{k=\"v\\x\"} 1\n",
      "# HELP a_total x\n# TYPE a_total counter\nb_total 1\n",
      "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
      "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 2\n",
      "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",
    }) do
      assert.has_error(function() parse(bad) end)
    end
  end)
end)

describe("redislock.metrics", function()
  local srv, raw
  helpers.redis_for(function(s, r) srv, raw = s, r end)

  it("counts what the client did, by kind and group, and renders text that parses", function()
    local too_long = {}
    local m = metrics_mod.new{ held_too_long = 0.2,
                               on_held_too_long = function(info) too_long[#too_long + 1] = info end }
    local waiting_seen
    local client = srv:client({ metrics = m, observer = function(event)
      if event == "waiting" then
        local _, value = parse(m:render())
        waiting_seen = value("redislock_waiting", { kind = "lock", group = "jobs" })
      end
    end })
    for i = 1, 5 do client:with_lock("orders:" .. i, 5, function() end) end
    local held = assert(client:acquire("orders:1", 5))
    local _, v = parse(m:render())
    assert.are.equal(1, v("redislock_holds", { kind = "lock", group = "orders" }))
    local _, err = client:acquire("orders:1", 5)
    assert.matches("^busy:", err)
    assert(held:release())
    -- A wait another process's release ends, handing the lock over.
    local p = helpers.spawn(helpers.spec_dir .. "workers/hold.lua", tostring(srv.port), "jobs:1", "1.5")
    assert.is_truthy(helpers.eventually(10, function() return raw:command("EXISTS", "lock:{jobs:1}") == 1 end))
    local lock = assert(client:acquire("jobs:1", 5, { wait = 10 }))
    assert(lock:release())
    assert.is_true(select(2, p.wait()))
    assert.are.equal(1, waiting_seen)
    -- A lease lost, held past held_too_long.
    local short = assert(client:acquire("jobs:2", 0.1))
    core.sleep(0.3)
    assert.matches("^lost:", select(2, short:release()))
    -- Errors: the server refuses (redis), a server not there (connection).
    assert.are.equal("OK", raw:command("CONFIG", "SET", "maxmemory", "1"))
    local _, rerr = client:acquire("orders:9", 5)
    assert.are.equal("OK", raw:command("CONFIG", "SET", "maxmemory", "0"))
    assert.matches("^redis:", rerr)
    local dead = redislock.new{ port = helpers.free_port(), metrics = m, connect_timeout = 0.5 }
    assert.matches("^connection:", select(2, dead:acquire("orders:9", 5)))

    local text = m:render()
    promtool(text)
    local families, value = parse(text)
    local n = lock_sample(value)
    assert.are.equal("counter", families.redislock_acquisitions_total.type)
    assert.are.equal("histogram", families.redislock_wait_seconds.type)
    assert.are.equal("gauge", families.redislock_holds.type)
    assert.are.equal(6, n("redislock_acquisitions_total", "orders"))
    assert.are.equal(6, n("redislock_releases_total", "orders"))
    assert.are.equal(1, n("redislock_busy_total", "orders"))
    assert.are.equal(2, n("redislock_acquisitions_total", "jobs"))
    assert.are.equal(1, n("redislock_releases_total", "jobs"))
    assert.are.equal(1, n("redislock_lost_total", "jobs"))
    assert.are.equal(1, n("redislock_handoffs_total", "jobs"))
    assert.are.equal(1, n("redislock_errors_total", "orders", { code = "redis" }))
    assert.are.equal(1, n("redislock_errors_total", "orders", { code = "connection" }))
    assert.are.equal(0, n("redislock_holds", "orders"))
    assert.are.equal(0, n("redislock_holds", "jobs"))
    assert.are.equal(0, n("redislock_waiting", "jobs"))
    assert.are.equal(1, n("redislock_held_too_long_total", "jobs"))
    assert.are.equal(0, n("redislock_held_too_long_total", "orders"))
    assert.are.equal(1, #too_long)
    assert.are.equal("jobs:2", too_long[1].key)
    -- The histograms: jobs:1 waited for most of 1.5 s, jobs:2 not at all.
    assert.are.equal(2, n("redislock_wait_seconds_count", "jobs"))
    assert.are.equal(1, n("redislock_wait_seconds_bucket", "jobs", { le = "0.5" }))
    assert.are.equal(2, n("redislock_wait_seconds_bucket", "jobs", { le = "+Inf" }))
    assert.is_true(n("redislock_wait_seconds_sum", "jobs") > 0.5)
    assert.are.equal(6, n("redislock_hold_seconds_count", "orders"))
    assert.are.equal(1, n("redislock_hold_seconds_count", "jobs"))
    assert.is_true(n("redislock_hold_seconds_sum", "orders") < 6 * 0.2 * helpers.slow)
    assert.matches('\nredislock_wait_seconds_bucket{kind="lock",group="jobs",le="0.5"} 1\n', text, 1, true)
    client:close()
  end)

  it("groups names: by prefix (at most max_groups), by a function, or all in one", function()
    local m = metrics_mod.new{ max_groups = 3 }
    local client = srv:client({ metrics = m })
    for _, key in ipairs({ "a:1", "a:2", "b:1", "c", "d:1", "e:1", 'q"\\\n:1' }) do
      client:with_lock(key, 5, function() end)
    end
    local families = parse(m:render())
    local groups = {}
    for _, s in ipairs(families.redislock_acquisitions_total.samples) do groups[s.labels.group] = s.value end
    assert.are.same({ a = 2, b = 1, c = 1, other = 3 }, groups)
    client:close()

    local by_fn = metrics_mod.new{ group = function(name, kind) return kind .. "/" .. #name end }
    client = srv:client({ metrics = by_fn })
    client:with_lock("xyz", 5, function() end)
    assert(assert(client:semaphore("sem", 2):acquire(5)):release())
    local _, value = parse(by_fn:render())
    assert.are.equal(1, value("redislock_acquisitions_total", { kind = "lock", group = "lock/3" }))
    assert.are.equal(1, value("redislock_releases_total", { kind = "permit", group = "permit/3" }))
    client:close()

    local quoted = metrics_mod.new{ group = function(name) return name end }
    client = srv:client({ metrics = quoted })
    client:with_lock('q"\\\n', 5, function() end)
    local text = quoted:render()
    promtool(text)
    value = select(2, parse(text))
    assert.are.equal(1, value("redislock_acquisitions_total", { kind = "lock", group = 'q"\\\n' }))
    assert.matches('group="q\\"\\\\\\n"', text, 1, true)
    client:close()

    local one = metrics_mod.new{ group = false }
    client = srv:client({ metrics = one })
    client:with_lock("x:1", 5, function() end)
    client:with_lock("y:1", 5, function() end)
    value = select(2, parse(one:render()))
    assert.are.equal(2, value("redislock_acquisitions_total", { kind = "lock", group = "all" }))
    client:close()
  end)

  it("takes its own buckets, and writes the text to a file whole", function()
    local m = metrics_mod.new{ wait_buckets = { 0.5 }, hold_buckets = { 0.05, 10 } }
    local client = srv:client({ metrics = m })
    client:with_lock("f:1", 5, function() core.sleep(0.1) end)
    local text = m:render()
    local _, value = parse(text)
    assert.are.equal(0, value("redislock_hold_seconds_bucket", { kind = "lock", group = "f", le = "0.05" }))
    assert.are.equal(1, value("redislock_hold_seconds_bucket", { kind = "lock", group = "f", le = "10" }))
    assert.are.equal(1, value("redislock_wait_seconds_bucket", { kind = "lock", group = "f", le = "0.5" }))
    local path = helpers.tmpdir() .. "/redislock.prom"
    assert.is_true(m:write(path))
    local f = assert(io.open(path))
    assert.are.equal(text, f:read("a"))
    f:close()
    assert.is_nil(io.open(path .. ".tmp"))
    assert.is_nil(select(1, m:write("/nonexistent/dir/x.prom")))
    assert.has_error(function() m:serve() end, "redislock: serve needs OpenResty; in plain Lua use render or write")
    client:close()
  end)

  it("refuses bad options with clear errors", function()
    for _, case in ipairs({
      { { bogus = 1 }, "unknown option" },
      { { group = 3 }, "option 'group' must be a function or false" },
      { { max_groups = 0 }, "option 'max_groups'" },
      { { wait_buckets = { 1, 0.5 } }, "option 'wait_buckets' must list finite seconds > 0 in increasing order" },
      { { hold_buckets = {} }, "option 'hold_buckets' must be a non-empty list" },
      { { held_too_long = -1 }, "option 'held_too_long' must be a number of seconds > 0" },
      { { on_held_too_long = 1 }, "option 'on_held_too_long' must be a function" },
      { { dict = "redislock_metrics" }, "option 'dict' needs OpenResty" },
    }) do
      local ok, err = pcall(metrics_mod.new, case[1])
      assert.is_false(ok)
      assert.matches("bad argument #1 to 'new'", err, 1, true)
      assert.matches(case[2], err, 1, true)
    end
    -- shared's messages name shared, and which of its arguments is wrong.
    for _, case in ipairs({
      { { bogus = 1 }, "unknown option" },
      { { group = 3 }, "option 'group' must be a function or false" },
      { { max_groups = 0 }, "option 'max_groups'" },
      { { wait_buckets = { 1, 0.5 } }, "option 'wait_buckets' must list finite seconds > 0 in increasing order" },
      { { held_too_long = -1 }, "option 'held_too_long' must be a number of seconds > 0" },
      { { dict = "redislock_metrics" }, "option 'dict' is the first argument" },
    }) do
      local ok, err = pcall(metrics_mod.shared, "redislock_metrics", case[1])
      assert.is_false(ok)
      assert.matches("bad argument #2 to 'shared' (" .. case[2], err, 1, true)
    end
    local ok, err = pcall(metrics_mod.shared, "redislock_metrics")
    assert.is_false(ok)
    assert.matches("bad argument #1 to 'shared' (dict needs OpenResty", err, 1, true)
    ok, err = pcall(redislock.new, { metrics = {} })
    assert.is_false(ok)
    assert.matches("option 'metrics' must be made by redislock.metrics.new", err, 1, true)
    assert.has_error(function() metrics_mod.new():observer(3) end)
  end)
end)

describe("redislock.metrics under OpenResty", function()
  if helpers.no_nginx(pending) then return end
  local srv
  helpers.redis_for(function(s) srv = s end)
  local nginx
  lazy_setup(function()
    local server = {
      helpers.redis_vars(srv),
      'set $dead_url "redis://127.0.0.1:' .. helpers.free_port() .. '";',
    }
    for _, name in ipairs({ "hold", "lose", "dead", "metrics" }) do
      server[#server + 1] = string.format(
        'location = /%s { content_by_lua_block { require("spec.support.ngx_metrics").%s() } }', name, name)
    end
    nginx = helpers.start_nginx({
      workers = 2,
      http = { "lua_shared_dict redislock_metrics 1m;", "lua_socket_log_errors off;" },
      reuseport = true,
      server = server,
    })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
  end)

  it("adds up both workers' figures in the shared dict, and serves them", function()
    -- Contention: 12 requests for one lock, each holding it 0.05 s.
    local requests = {}
    for i = 1, 12 do requests[i] = "/hold?key=orders:1&wait=20&hold=0.05" end
    local results = http.parallel(nginx.port, requests, { timeout = 60 })
    local pids = {}
    for i, r in ipairs(results) do
      assert.are.equal(200, r.status, "request " .. i .. ": " .. r.body .. nginx:error_log())
      pids[r.body:match("%d+")] = true
    end
    local workers = 0
    for _ in pairs(pids) do workers = workers + 1 end
    assert.are.equal(2, workers, "both workers served")
    -- Waiters now: 4 requests for one lock held 1 s each, seen 0.5 s in.
    requests = {}
    for i = 1, 4 do requests[i] = "/hold?key=jobs:1&wait=20&hold=1" end
    requests[5] = "/metrics?delay=0.5"
    results = http.parallel(nginx.port, requests, { timeout = 60 })
    local _, during = parse(results[5].body)
    assert.are.equal(1, during("redislock_holds", { kind = "lock", group = "jobs" }))
    local waiting = during("redislock_waiting", { kind = "lock", group = "jobs" })
    assert.is_true(waiting >= 1 and waiting <= 3, "waiting " .. waiting)
    for i = 1, 4 do assert.are.equal(200, results[i].status, results[i].body) end
    -- A busy answer (a hold of 1 s, and a request that does not wait), a
    -- lost lease, a server not there.
    local long = http.start(nginx.port, "GET", "/hold?key=jobs:2&hold=1")
    assert.is_truthy(helpers.eventually(10, function() return srv:cli("EXISTS", "lock:{jobs:2}") == "1" end))
    local status, body = http.request(nginx.port, "GET", "/hold?key=jobs:2")
    assert.are.equal(409, status, body)
    assert.are.equal(200, (long:finish()))
    status, body = http.request(nginx.port, "GET", "/lose?key=jobs:3")
    assert.are.equal(200, status, body)
    assert.matches("^lost:", body)
    status, body = http.request(nginx.port, "GET", "/dead?key=jobs:4")
    assert.are.equal(503, status)
    assert.matches("^connection:", body)

    local headers
    status, body, headers = http.request(nginx.port, "GET", "/metrics")
    assert.are.equal(200, status)
    assert.are.equal("text/plain; version=0.0.4; charset=utf-8", headers["content-type"])
    promtool(body)
    local _, value = parse(body)
    local n = lock_sample(value)
    assert.are.equal(12, n("redislock_acquisitions_total", "orders"))
    assert.are.equal(12, n("redislock_releases_total", "orders"))
    assert.are.equal(12, n("redislock_wait_seconds_count", "orders"))
    assert.are.equal(12, n("redislock_hold_seconds_count", "orders"))
    assert.is_true(n("redislock_hold_seconds_sum", "orders") >= 12 * 0.05)
    local handoffs = n("redislock_handoffs_total", "orders")
    assert.is_true(handoffs >= 1 and handoffs <= 11, "handoffs " .. handoffs)
    -- jobs: 4 waited holds, the 1 s hold, the lost lease
    assert.are.equal(6, n("redislock_acquisitions_total", "jobs"))
    assert.are.equal(5, n("redislock_releases_total", "jobs"))
    assert.are.equal(1, n("redislock_busy_total", "jobs"))
    assert.are.equal(1, n("redislock_lost_total", "jobs"))
    assert.are.equal(1, n("redislock_errors_total", "jobs", { code = "connection" }))
    -- held_too_long = 0.5: the four of 1 s and the one of 1 s
    assert.are.equal(5, n("redislock_held_too_long_total", "jobs"))
    assert.are.equal(0, n("redislock_holds", "jobs"))
    assert.are.equal(0, n("redislock_waiting", "jobs"))
    assert.are.equal(5, n("redislock_hold_seconds_count", "jobs"))
    assert.are.equal(0, n("redislock_hold_seconds_bucket", "jobs", { le = "0.5" }))
    assert.is_true(n("redislock_hold_seconds_sum", "jobs") >= 5)
    -- The last three of the four waited about 1, 2 and 3 s.
    assert.is_true(n("redislock_wait_seconds_sum", "jobs") >= 0.9 * (1 + 2 + 3))
    assert.are.same({}, { nginx:error_log():match("%[error%][^\n]*") })
  end)

  it("keeps a group whose name holds the shared dict's separator (\\1) apart", function()
    -- The default group is the name's part before its first ':'.
    for _, key in ipairs({ "a%01b:1", "a%01b:2", "a%02b:1", "a:1" }) do
      local status, body = http.request(nginx.port, "GET", "/hold?key=" .. key)
      assert.are.equal(200, status, body)
    end
    local status, body = http.request(nginx.port, "GET", "/metrics")
    assert.are.equal(200, status, body)
    local _, value = parse(body)
    assert.are.equal(2, value("redislock_acquisitions_total", { kind = "lock", group = "a\1b" }))
    assert.are.equal(1, value("redislock_acquisitions_total", { kind = "lock", group = "a\2b" }))
    assert.are.equal(1, value("redislock_acquisitions_total", { kind = "lock", group = "a" }))
    assert.are.equal(2, value("redislock_hold_seconds_count", { kind = "lock", group = "a\1b" }))
    assert.are.same({}, { nginx:error_log():match("%[error%][^\n]*") })
  end)
end)
