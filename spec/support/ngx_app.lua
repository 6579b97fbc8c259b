-- SPDX-License-Identifier: MIT
-- The handlers the specs' OpenResty parts ("under OpenResty") put behind
-- nginx locations, e.g. `content_by_lua_block { require("spec.support.ngx_app").counter() }`.
-- The Redis URL comes from `set $redis_url ...;` in the location or server; a
-- client per URL is made once per worker and shared by its requests, as an
-- application would.
local core = require("redislock.core")
local redislock = require("redislock")

local app = {}
local clients = {}

-- The tls option a mode asks for (nil: none): "mtls" (the test certificates
-- in $redis_tls_dir), "nocert" (no client certificate), "noverify" (mtls,
-- unchecked), "ca" (mtls plus tls.ca); name is the server_name, if any.
local function tls_option(mode, name)
  local dir = ngx.var.redis_tls_dir
  if not mode or mode == "" then return nil end
  local t = { server_name = name and name:find("%S") and name or nil, verify = mode ~= "noverify" }
  if mode ~= "nocert" then t.cert, t.key = dir .. "/client.crt", dir .. "/client.key" end
  if mode == "ca" then t.ca = dir .. "/ca.crt" end
  return t
end

-- A variable's value, nil when unset or empty.
local function var(name)
  local v = ngx.var[name]
  if v ~= nil and v ~= "" then return v end
end

-- The worker's client for $redis_url (and $redis_timeout seconds, and TLS
-- settings, if set); or, with $redis_sentinels ("host:port,host:port"), for
-- $redis_master behind them (and $redis_sentinel_tls, a mode as $redis_tls's
-- with the name "localhost", "nonamemtls" for mtls with none, and
-- $redis_sentinel_password); or, with $redis_cluster ("host:port,..."), for
-- that cluster; or, with $redis_redlock ("url,url,..."), for Redlock over
-- those servers. $redis_pool_size, $redis_wait_connections and
-- $redis_coalesce ("off") set those options of a single server's client.
local function client()
  local id = table.concat({ var("redis_url") or "", var("redis_timeout") or "", var("redis_tls") or "",
                            var("redis_tls_name") or "", var("redis_sentinels") or "", var("redis_master") or "",
                            var("redis_sentinel_tls") or "", var("redis_sentinel_password") or "",
                            var("redis_cluster") or "", var("redis_redlock") or "", var("redis_pool_size") or "",
                            var("redis_wait_connections") or "", var("redis_coalesce") or "" }, "|")
  if clients[id] then return clients[id] end
  local tls = tls_option(var("redis_tls"), var("redis_tls_name"))
  if var("redis_redlock") then -- "url,url,..."
    local list = {}
    for u in var("redis_redlock"):gmatch("[^,]+") do list[#list + 1] = u end
    clients[id] = redislock.new{ redlock = list }
  elseif var("redis_cluster") then -- "host:port,host:port"
    local seeds = {}
    for a in var("redis_cluster"):gmatch("[^,]+") do seeds[#seeds + 1] = a end
    clients[id] = redislock.new{ cluster = seeds, timeout = 2, tls = tls }
  elseif var("redis_sentinels") then
    local list = {}
    for a in var("redis_sentinels"):gmatch("[^,]+") do list[#list + 1] = a end
    clients[id] = redislock.new{ sentinels = list, master = var("redis_master"), timeout = 2, tls = tls,
                                 sentinel_tls = var("redis_sentinel_tls") == "nonamemtls"
                                   and tls_option("mtls") or tls_option(var("redis_sentinel_tls"), "localhost"),
                                 sentinel_password = var("redis_sentinel_password") }
  else
    clients[id] = redislock.new{ url = var("redis_url"), timeout = tonumber(var("redis_timeout") or ""), tls = tls,
                                 pool_size = tonumber(var("redis_pool_size") or ""),
                                 wait_connections = tonumber(var("redis_wait_connections") or ""),
                                 coalesce = var("redis_coalesce") ~= "off" }
  end
  return clients[id]
end


-- The port of the node the client sends key's lock to: the master behind
-- Sentinel, or the owner of its slot in a cluster (0 while the slot table
-- names none: see spec/workers/loop.lua).
local function node_port(c, key)
  local t = c._transport
  if t._slots then
    local owner = t._slots[core.lock_slot(key)]
    return owner and owner.port or 0
  end
  return t._port
end

local function arg_number(name, default)
  return tonumber(ngx.var["arg_" .. name]) or default
end

-- Ends the request with status and body (a line).
local function reply(status, body)
  ngx.status = status
  ngx.say(body)
  return ngx.exit(status)
end

-- The status for an error message, by its code word.
local function status_for(err)
  local code = tostring(err):match("^(%a+):")
  return ({ busy = 409, lost = 409, connection = 503, redis = 502 })[code] or 500
end

--- GET /counter[?lock=notify|poll|fair]: one read-modify-write of the
-- counter, with a yield between the read and the write (and a check for
-- overlaps: "inside" counts the requests between read and write at once,
-- "overlaps" how often it was found above one). With lock it runs inside
-- with_lock, waiting that way.
function app.counter()
  local c = client()
  -- The counter's server: $redis_data_url, else the lock's (a Redlock
  -- client has no single server for commands).
  local d = c
  if var("redis_data_url") then
    clients[var("redis_data_url")] = clients[var("redis_data_url")] or redislock.new(var("redis_data_url"))
    d = clients[var("redis_data_url")]
  end
  local function work()
    if assert(d:command("INCR", "inside")) > 1 then assert(d:command("INCR", "overlaps")) end
    local v, err = d:command("GET", "counter")
    assert(v ~= nil, err)
    v = tonumber(v) or 0
    ngx.sleep(0.001)
    assert(d:command("SET", "counter", v + 1))
    assert(d:command("DECR", "inside"))
  end
  local mode = ngx.var.arg_lock
  if mode then
    c:with_lock("counter", 5, work, { wait = 60, wait_mode = mode == "fair" and "notify" or mode,
                                      fair = mode == "fair" })
  else
    work()
  end
  ngx.header["X-Worker"] = ngx.worker.pid()
  ngx.say("ok")
end

--- GET /acquire?key=k&ttl=s&wait=s[&mode=notify|poll][&fair=1] -> 200 "fence token" | 409 busy | 503 connection
function app.acquire()
  local lock, err = client():acquire(ngx.var.arg_key, arg_number("ttl", 5),
                                     { wait = arg_number("wait", 0), wait_mode = ngx.var.arg_mode,
                                       fair = ngx.var.arg_fair == "1" or nil })
  if not lock then return reply(status_for(err), err) end
  return reply(200, lock.fence .. " " .. lock.token)
end

--- GET /reenter?key=k[&rw=1]: inside with_lock on k (with_read on the
-- read-write lock k, with rw), takes k again (its write lock) -> 200 and
-- the busy message that second take answered.
function app.reenter()
  local c, key = client(), ngx.var.arg_key
  local err
  if ngx.var.arg_rw == "1" then
    err = c:rwlock(key):with_read(5, function() return select(2, c:rwlock(key):write(5)) end)
  else
    err = c:with_lock(key, 5, function() return select(2, c:acquire(key, 5)) end)
  end
  return reply(200, tostring(err))
end

--- GET /guarded?key=k&ttl=s&form=fenced|owned&rkey=r[&rport=p]: takes k
-- (no renewal), sets "<r>:pid" to the worker's PID (for the spec's
-- SIGSTOP), waits until "<r>:go" exists, then writes "old" to r through the
-- lock's guard (fenced to the server on port p, if given) -> 200 "written"
-- | "refused <message>".
function app.guarded()
  local c, rkey = client(), ngx.var.arg_rkey
  local lock, err = c:acquire(ngx.var.arg_key, arg_number("ttl", 0.5), { renew = false })
  if not lock then return reply(status_for(err), err) end
  assert(c:command("SET", rkey .. ":pid", ngx.worker.pid()))
  while c:command("EXISTS", rkey .. ":go") == 0 do ngx.sleep(0.01) end
  local rport = tonumber(ngx.var.arg_rport or "")
  if rport and not clients[rport] then clients[rport] = redislock.new{ port = rport } end
  local guard = ngx.var.arg_form == "owned" and lock:owned() or lock:fenced(rport and clients[rport])
  local ok, werr = guard:set(rkey, "old")
  return reply(200, ok and "written" or "refused " .. tostring(werr))
end

--- GET /new: makes a client as client() would, reporting an error raised
-- (500 and the message) instead of a lock.
function app.new()
  local ok, err = pcall(client)
  if not ok then return reply(500, err) end
  return reply(200, tostring(err))
end

--- GET /release?key=k&token=t -> 200 | 409 lost
function app.release()
  local ok, err = client():from_token(ngx.var.arg_key, ngx.var.arg_token):release()
  if not ok then return reply(status_for(err), err) end
  return reply(200, "released")
end

--- GET /section?key=k: with_lock (waiting up to 5 s) around a 2 ms section;
-- 200 "ok <enter> <leave> <port> <fence> <token>" (core.now() times; port:
-- the master it ran on) or the error's status and message.
function app.section()
  local c = client()
  local enter, leave, port, fence, token
  local ok, err = pcall(c.with_lock, c, ngx.var.arg_key, 2, function(lock)
    enter, port, fence, token = core.now(), node_port(c, ngx.var.arg_key), lock.fence, lock.token
    ngx.sleep(0.002)
    leave = core.now()
  end, { wait = 5 })
  if not ok then return reply(status_for(err), tostring(err)) end
  return reply(200, string.format("ok %.6f %.6f %d %d %s", enter, leave, port, fence, token))
end

--- GET /master: the port of the master the worker's client uses now (after
-- a PING, which resolves it when needed), and the worker's pid.
function app.master()
  local c = client()
  local pong, err = c:command("PING") -- resolves the master first, if needed
  if not pong then return reply(status_for(err), err) end
  return reply(200, tostring(c._transport._port) .. " " .. ngx.worker.pid())
end

--- GET /pointed: the port of the node the worker's client points at now,
-- without any I/O (behind Sentinel: moved there by its watch, or resolved).
function app.pointed()
  return reply(200, tostring(client()._transport._port))
end

--- GET /ping: answers at once (the non-blocking spec).
function app.ping()
  ngx.say("pong")
end

--- GET /with_lock?key=k&ttl=s&hold=s[&renew=0][&on_lost=1][&mark=1][&lock_delay=s]:
-- holds the lock hold seconds (ngx.sleep inside fn) -> 200 "fence" | 409
-- lost/busy | 503. renew=0 turns the renewal off; on_lost=1 reports what
-- on_lost was called with after a lost error; mark=1 sets the key
-- "inside:<k>" once fn runs; lock_delay: that option.
local lost_calls = {} -- key -> the error on_lost was called with (in the renewal timer)

function app.with_lock()
  local key = ngx.var.arg_key
  lost_calls[key] = nil
  local on_lost = ngx.var.arg_on_lost == "1" and function(_, err) lost_calls[key] = err end or nil
  local ok, fence = pcall(client().with_lock, client(), key, arg_number("ttl", 5), function(lock)
    if ngx.var.arg_mark == "1" then assert(client():command("SET", "inside:" .. key, "1")) end
    ngx.sleep(arg_number("hold", 0))
    return lock.fence
  end, { renew = ngx.var.arg_renew ~= "0", on_lost = on_lost, lock_delay = arg_number("lock_delay") })
  if not ok then
    return reply(status_for(fence), fence .. (on_lost and " | on_lost: " .. tostring(lost_calls[key]) or ""))
  end
  return reply(200, fence)
end

--- GET /holds?key=k: takes and gives back a lock, a semaphore's permit, a
-- read and a write hold and a 2-key lock on names from k, each through its
-- scoped form -> 200 "lock=F permit=F read=F write=F multi=F" (their fences).
function app.holds()
  local c, key = client(), ngx.var.arg_key
  local function fence(h) return type(h.fence) == "table" and h.fence[1] or h.fence end
  local out = {
    "lock=" .. c:with_lock(key, 5, fence),
    "permit=" .. c:semaphore(key .. ":pool", 2):with_permit(5, fence),
    "read=" .. c:rwlock(key .. ":doc"):with_read(5, fence),
    "write=" .. c:rwlock(key .. ":doc"):with_write(5, fence),
    "multi=" .. c:with_lock({ key .. ":a", key .. ":b" }, 5, fence),
  }
  return reply(200, table.concat(out, " "))
end

--- GET /primitive?kind=sem|read|write|multi[&limit=n][&keys=a,b][&hold=s][&ttl=s]: one
-- section under a semaphore's permit (limit n; "inside" counts holders and
-- "seen" lists the count at each entry), a read or write hold on "doc"
-- ("readers" and "writers" count holders; a reader beside a writer or two
-- writers count in "overlaps"), or a multi-key lock ("in:<key>" counts
-- holders; more than one counts in "overlaps"). Replies the hold's fence
-- (the first key's for a multi-key lock) after checking the hold.
function app.primitive()
  local c, kind, hold = client(), ngx.var.arg_kind, arg_number("hold", 0.002)
  local function cmd(...) return assert(c:command(...)) end
  local opts = { wait = 60 }
  local ttl = arg_number("ttl", 5)
  -- fn for a with_* call: enter(), the hold checked after hold seconds,
  -- leave(); returns the hold's fence.
  local function section(enter, leave)
    return function(h)
      enter()
      ngx.sleep(hold)
      assert(h:check(true))
      leave()
      return type(h.fence) == "table" and h.fence[1] or h.fence
    end
  end
  local fence
  if kind == "sem" then
    fence = c:semaphore("pool", arg_number("limit", 3)):with_permit(ttl, section(
      function() cmd("RPUSH", "seen", cmd("INCR", "inside")) end,
      function() cmd("DECR", "inside") end), opts)
  elseif kind == "read" then
    fence = c:rwlock("doc"):with_read(ttl, section(function()
      cmd("INCR", "readers")
      if tonumber(cmd("GET", "writers") or 0) ~= 0 then cmd("INCR", "overlaps") end
    end, function() cmd("DECR", "readers") end), opts)
  elseif kind == "write" then
    fence = c:rwlock("doc"):with_write(ttl, section(function()
      if cmd("INCR", "writers") ~= 1 or tonumber(cmd("GET", "readers") or 0) ~= 0 then cmd("INCR", "overlaps") end
    end, function() cmd("DECR", "writers") end), opts)
  else
    local keys = {}
    for k in ngx.var.arg_keys:gmatch("[^,]+") do keys[#keys + 1] = k end
    fence = c:with_lock(keys, ttl, section(function()
      for _, k in ipairs(keys) do
        if cmd("INCR", "in:" .. k) ~= 1 then cmd("INCR", "overlaps") end
      end
    end, function()
      for _, k in ipairs(keys) do cmd("DECR", "in:" .. k) end
    end), opts)
  end
  return reply(200, fence)
end

--- GET /fences?key=k&fresh=f[&multi=0]: takes and releases a lock on k and
-- on f, a permit of semaphore "<k>:pool" (limit 2), the writer of
-- read-write lock "<k>:doc" and (unless multi=0) a multi-key lock on
-- "<k>:a" and "<k>:b" -> 200 "lock=N fresh=N permit=N write=N multi_a=N
-- multi_b=N" (their fences) | the first error's status and message.
function app.fences()
  local c, key = client(), ngx.var.arg_key
  local out = {}
  local function take(name, h, err)
    if not h then return reply(status_for(err), err) end
    local fence = h.fence
    if type(fence) == "table" then
      out[#out + 1] = string.format("%s_a=%d %s_b=%d", name, fence[1], name, fence[2])
    else
      out[#out + 1] = string.format("%s=%d", name, fence)
    end
    local ok, rerr = h:release()
    if not ok then return reply(status_for(rerr), rerr) end
  end
  take("lock", c:acquire(key, 5))
  take("fresh", c:acquire(ngx.var.arg_fresh, 5))
  take("permit", c:semaphore(key .. ":pool", 2):acquire(5))
  take("write", c:rwlock(key .. ":doc"):write(5))
  if ngx.var.arg_multi ~= "0" then take("multi", c:acquire({ key .. ":a", key .. ":b" }, 5)) end
  return reply(200, table.concat(out, " "))
end

--- GET /leave?key=k&ttl=s&how=exit|exec|redirect|kill|access[&wait=s][&hold=s]: fn
-- (after hold seconds, 0) ends its request thread without unwinding: ngx.exit (after a line of output),
-- ngx.exec or ngx.redirect to /ping, or (kill) fn runs in a light thread
-- that the entry thread kills once the lock is held; access: ngx.exit(403)
-- from an access handler (see /guarded). wait: with_lock's (0).
function app.leave()
  local c, how = client(), ngx.var.arg_how
  local key, ttl = ngx.var.arg_key, arg_number("ttl", 1)
  local opts = { wait = arg_number("wait", 0) }
  if how == "kill" then
    -- Killed once fn runs (its lease started): a kill while with_lock still
    -- acquires (the key set, the answer not back) would leave the lock to
    -- its TTL, as a lost reply does.
    local running = false
    local t = ngx.thread.spawn(c.with_lock, c, key, ttl, function()
      running = true
      ngx.sleep(30)
    end, opts)
    while not running do ngx.sleep(0.01) end
    assert(ngx.thread.kill(t))
    return reply(200, "killed")
  end
  c:with_lock(key, ttl, function()
    ngx.sleep(arg_number("hold", 0))
    if how == "exec" then return ngx.exec("/ping") end
    if how == "redirect" then return ngx.redirect("/ping") end
    if how == "access" then return ngx.exit(403) end
    ngx.say("bye")
    return ngx.exit(200)
  end, opts)
  return reply(500, "with_lock returned")
end

--- GET /crowd?key=k&wait=s[&hold=s][&ttl=s][&fair=1]: one section under
-- with_lock on k (waiting up to wait s; ttl 5): "inside:<k>" counts the
-- requests inside at once, "overlaps:<k>" how often it was found above one,
-- and each section appends "<fence> <token> <worker pid>" to the list
-- "sections:<k>" as it begins and "<enter> <leave>" (core.now(), a clock
-- all processes share) to "spans:<k>" as it ends -> 200 "<fence>" | the
-- error's status and message.
--- GET /election?name=N: over the worker's client, campaigns in the
-- election N (value "a"), reads who leads, proclaims "b", has an observer
-- hear it, resigns: "<term> <value read> <value read after> <heard>" (200),
-- or the error with its status.
function app.election()
  local e = client():election(ngx.var.arg_name)
  local lead, err = e:campaign("a", 5, { wait = 5 })
  if not lead then return reply(status_for(err), err) end
  local before = assert(e:leader())
  assert(lead:proclaim("b"))
  local after = assert(e:leader())
  local heard
  assert(e:observe(function(l) heard = l and l.value return false end))
  assert(lead:resign())
  assert(e:leader() == false)
  return reply(200, string.format("%.0f %s %s %s", lead.term, before.value, after.value, heard))
end

function app.crowd()
  local c, key = client(), ngx.var.arg_key
  local function cmd(...) return assert(c:command(...)) end
  local ok, res = pcall(c.with_lock, c, key, arg_number("ttl", 5), function(lock)
    local enter = core.now()
    if cmd("INCR", "inside:" .. key) > 1 then cmd("INCR", "overlaps:" .. key) end
    cmd("RPUSH", "sections:" .. key, lock.fence .. " " .. lock.token .. " " .. ngx.worker.pid())
    ngx.sleep(arg_number("hold", 0.001))
    assert(lock:check())
    cmd("DECR", "inside:" .. key)
    cmd("RPUSH", "spans:" .. key, string.format("%.6f %.6f", enter, core.now()))
    return lock.fence
  end, { wait = arg_number("wait", 10), fair = ngx.var.arg_fair == "1" or nil })
  if not ok then return reply(status_for(res), tostring(res)) end
  return reply(200, tostring(res))
end

--- GET /abandon?key=k&after=s: a light thread waits for k (up to 30 s; the
-- worker's first waiter for it waits on Redis for the others); after s
-- seconds the entry thread ends the request with ngx.exit, which kills
-- that thread mid-wait, leaving nothing -> 200 "abandoned".
function app.abandon()
  local c = client()
  ngx.thread.spawn(c.acquire, c, ngx.var.arg_key, 5, { wait = 30 })
  ngx.sleep(arg_number("after", 0.2))
  ngx.say("abandoned")
  return ngx.exit(200)
end

--- GET /drop?key=k&ttl=s: with_lock inside a coroutine of the handler's own,
-- dropped while suspended in fn, then a full collection. Answers at once.
function app.drop()
  local c = client()
  local co = coroutine.create(function()
    c:with_lock(ngx.var.arg_key, arg_number("ttl", 1), function() coroutine.yield() end)
  end)
  assert(coroutine.resume(co))
  co = nil -- luacheck: ignore (dropped on purpose)
  collectgarbage()
  collectgarbage()
  return reply(200, "dropped")
end

--- GET /module: redislock.with_lock on the default client (REDIS_URL).
function app.module()
  local fence, tostr = redislock.with_lock("module", 5, function(lock)
    return lock.fence, tostring(redislock.default_client())
  end)
  return reply(200, fence .. " " .. tostr)
end

--- GET /raise: fn raises; nothing catches it, so ngx_lua logs it and answers 500.
function app.raise()
  client():with_lock("raising", 30, function()
    error("boom from fn")
  end)
end

--- GET /raise_table: fn raises a table; with_lock re-raises that very table.
function app.raise_table()
  local err = { code = 42 }
  local ok, got = pcall(client().with_lock, client(), "raising", 30, function() error(err) end)
  return reply(200, tostring(not ok and got == err and got.code == 42))
end

--- GET /phase: acquire and a command from header_filter, acquire from log,
-- where cosockets are missing.
function app.header_filter()
  local ok, err = pcall(client().acquire, client(), "phase", 5)
  ngx.header["X-Redislock-Error"] = ok and "none" or tostring(err)
  ok, err = pcall(client().command, client(), "PING")
  ngx.header["X-Redislock-Command-Error"] = ok and "none" or tostring(err)
end

function app.log()
  local ok, err = pcall(client().acquire, client(), "phase", 5)
  ngx.log(ngx.ERR, "log phase: ", ok and "none" or tostring(err))
  ok, err = pcall(redislock.with_lock, "phase", 5, function() end)
  ngx.log(ngx.ERR, "log phase, module: ", ok and "none" or tostring(err))
end

--- GET /cut_release?key=K&cut=0.2&wait=0.5: takes K, waits wait seconds
-- (the spec makes the server sleep or busy meanwhile), releases it in a
-- light thread that is killed cut seconds into the release, then (once
-- the server answers) says "<EXISTS of the lock> <a second release's
-- result> <its error> <whether K is taken again at once>".
function app.cut_release()
  local c, key = client(), ngx.var.arg_key
  local lock = assert(c:acquire(key, 10))
  ngx.sleep(arg_number("wait", 0.5))
  local t = ngx.thread.spawn(function() return lock:release() end)
  ngx.sleep(arg_number("cut", 0.2))
  local killed, kerr = ngx.thread.kill(t)
  if not killed then return reply(500, "not killed: " .. tostring(kerr)) end
  local exists, err
  for _ = 1, 100 do
    exists, err = c:command("EXISTS", "lock:{" .. key .. "}")
    if exists then break end
    ngx.sleep(0.05)
  end
  if not exists then return reply(500, "no answer: " .. tostring(err)) end
  local ok, rerr = lock:release()
  local again, aerr = c:acquire(key, 1)
  if again then again:release() end
  return reply(200, string.format("%d %s %s %s", exists, tostring(ok), tostring(rerr), again and "again" or aerr))
end

return app
