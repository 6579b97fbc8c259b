-- SPDX-License-Identifier: MIT
-- Under OpenResty, a request whose lock the worker's renewal timer found
-- lost while fn ran ends when its handler does: with_lock raises "lost",
-- and nothing of the lock's renewal keeps the request open after, also
-- while other requests run (ngx_lua gives the coroutine of a thread that
-- ended to the next thread; with_lock's sentinel once waited on its status,
-- and kept its request open while the coroutine served another: make
-- torture's Redlock hang), and a killed fn thread's lock goes back while
-- one that runs keeps it, also while new threads run on the coroutines
-- ngx_lua reuses. Over Redlock (five servers) and one server, in
-- a real nginx whose handler returns as an application's does (no
-- ngx.exit, which would end every light thread of the request itself).
local helpers = require("spec.helpers")
local socket = require("socket")

describe("under OpenResty, a lock the renewal timer found lost", function()
  if helpers.no_nginx(pending) then return end

  local servers, urls, nginx

  -- GET /hold?key=k&ttl=s&hold=s[&one=1]: with_lock over Redlock (one=1:
  -- the first server alone), fn sleeping hold seconds; answers "<ok>
  -- <handler's seconds> <error>" from a handler that returns. The worker's
  -- clients are in the global clients, made by init_by_lua. GET /sleep?s=s
  -- sleeps s seconds. GET /killed and /reused: see their cases below.
  local HANDLER = [[
    location = /sleep { content_by_lua_block { ngx.sleep(tonumber(ngx.var.arg_s)) ngx.say("slept") } }
    location = /killed { content_by_lua_block {
      local redislock = require("redislock")
      clients.one = clients.one or redislock.new{ url = ngx.var.redlock_urls:match("^[^,]+") }
      local c, running = clients.one, false
      local t = ngx.thread.spawn(c.with_lock, c, ngx.var.arg_key, 1, function()
        running = true
        ngx.sleep(30)
      end)
      while not running do ngx.sleep(0.01) end
      ngx.sleep(1.8)
      ngx.thread.kill(t)
      ngx.sleep(0.2)
      ngx.say("killed")
    } }
    location = /reused { content_by_lua_block {
      local redislock = require("redislock")
      clients.one = clients.one or redislock.new{ url = ngx.var.redlock_urls:match("^[^,]+") }
      local c, entry = clients.one, coroutine.running()
      ngx.thread.spawn(function()
        ngx.sleep(0) -- the handler's thread returns meanwhile, and ngx_lua keeps its coroutine for the next thread
        local fn_co
        local t = ngx.thread.spawn(c.with_lock, c, ngx.var.arg_key, 1, function()
          fn_co = coroutine.running()
          ngx.sleep(30)
        end)
        while not fn_co do ngx.sleep(0.01) end
        ngx.sleep(1.2)
        ngx.thread.kill(t)
        ngx.thread.wait(ngx.thread.spawn(function() ngx.sleep(2.85) end))
        ngx.say(fn_co == entry and "on the handler's coroutine" or "on another coroutine", ", killed")
      end)
    } }
    location = /hold { content_by_lua_block {
      local redislock = require("redislock")
      local urls, one = ngx.var.redlock_urls, ngx.var.arg_one == "1"
      local list = {}
      for u in urls:gmatch("[^,]+") do list[#list + 1] = u end
      local id = one and "one" or "redlock"
      clients[id] = clients[id] or redislock.new(one and { url = list[1] } or { redlock = list })
      local c = clients[id]
      ngx.update_time()
      local began = ngx.now()
      local ok, err = pcall(c.with_lock, c, ngx.var.arg_key, tonumber(ngx.var.arg_ttl), function()
        ngx.sleep(tonumber(ngx.var.arg_hold))
      end)
      ngx.update_time()
      ngx.say(tostring(ok), " ", string.format("%.3f", ngx.now() - began), " ", tostring(err))
    } } ]]

  lazy_setup(function()
    servers, urls = helpers.start_redlock(5)
    nginx = helpers.start_nginx({ workers = 1, http = "lua_socket_log_errors off; init_by_lua_block { clients = {} }",
                                  server = { 'set $redlock_urls "' .. urls .. '";', HANDLER } })
  end)
  lazy_teardown(function()
    if nginx then nginx:stop() end
    for _, s in ipairs(servers or {}) do s:stop() end
  end)

  -- Sends GET path and returns the connection, to read the answer later.
  local function send(path)
    local c = socket.tcp()
    c:settimeout(30)
    assert(c:connect("127.0.0.1", nginx.port))
    assert(c:send("GET " .. path .. " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"))
    return c
  end

  -- Holds key for hold seconds in a request (TTL 1 s), takes it on the
  -- servers given meanwhile (another owner's token), and returns how long
  -- the request took, how long its handler said it took, and its answer.
  -- A request sleeping 4 s is sent 0.25 s after the hold's end, when the
  -- handler has returned: its thread may be given the coroutine the
  -- handler's thread ran on.
  local function lost_while_held(key, hold, query, taken_on)
    local began = socket.gettime()
    local c = send("/hold?key=" .. key .. "&ttl=1&hold=" .. hold .. (query or ""))
    local name = "lock:{" .. key .. "}"
    -- Its renewal (every third of the TTL) then finds another owner there.
    assert(helpers.eventually(5, function() return servers[1]:cli("EXISTS", name) == "1" end))
    for _, i in ipairs(taken_on) do servers[i]:cli("SET", name, "another", "PX", "10000") end
    socket.sleep(math.max(0, began + hold + 0.25 - socket.gettime()))
    local other = send("/sleep?s=4")
    local answer = assert(c:receive("*a"))
    c:close()
    local took = socket.gettime() - began
    assert(other:receive("*a"))
    other:close()
    local body = answer:match("\r\n\r\n(.*)$")
    local handler = tonumber(body:match("^%x*\r?\n?%a+ ([%d.]+)"))
    return took, handler, body
  end

  -- The request ends with its handler: its sentinel (with_lock's watch on
  -- the request's thread, redislock/ngx_lease.lua) is not left waiting.
  -- Its hold ends just past a whole second of the sentinel's steps, so that
  -- a sentinel left behind keeps the request open most of a second more.
  local function ends_with_handler(key, query, taken_on)
    local took, handler, body = lost_while_held(key, 2.05, query, taken_on)
    assert.matches('false [%d.]+ lost: "' .. key .. '" is no longer ours', body, 1, false)
    assert.matches("found by the renewal timer", body, 1, true)
    assert(took - handler < 0.5, string.format("the request took %.3f s, its handler %.3f s: %s%s", took, handler,
                                               body, nginx:error_log()))
  end

  it("over Redlock: the request ends with its handler", function()
    ends_with_handler("r1", nil, { 1, 2, 3 })
  end)

  it("on one server: the request ends with its handler", function()
    ends_with_handler("s1", "&one=1", { 1 })
  end)

  -- GET /killed: fn's thread, a light thread, killed 1.8 s after fn began
  -- (its lock renewed meanwhile, its sentinel looking at it past a step);
  -- the request goes on 0.2 s and returns. Its sentinel leaves at its next
  -- step, while the thread's coroutine may serve another request's thread,
  -- and the lock goes back at its next renewal (a third of its TTL).
  it("gives back the lock of a killed fn thread and does not hold up its request", function()
    local began = socket.gettime()
    local c = send("/killed?key=k1")
    assert(helpers.eventually(5, function() return servers[1]:cli("EXISTS", "lock:{k1}") == "1" end))
    local held = socket.gettime()
    socket.sleep(1.5)
    assert.are.equal("1", servers[1]:cli("EXISTS", "lock:{k1}"),
                     "given back while fn's thread ran" .. nginx:error_log())
    socket.sleep(math.max(0, held + 1.9 - socket.gettime()))
    local other = send("/sleep?s=4")
    local answer = assert(c:receive("*a"))
    c:close()
    local took = socket.gettime() - began
    assert.matches("killed", answer, 1, true)
    assert(took < 3.5, string.format("the request took %.3f s%s", took, nginx:error_log()))
    assert(helpers.eventually(2, function() return servers[1]:cli("EXISTS", "lock:{k1}") == "0" end),
           "the lock outlived its thread")
    assert(other:receive("*a"))
    other:close()
  end)

  -- GET /reused?key=k: the handler's thread starts a light thread and
  -- returns; that thread runs with_lock (one server, TTL 1 s) in a light
  -- thread of its own, whose fn sleeps, kills it 1.2 s after fn began, at
  -- once starts another that sleeps 2.85 s, waits for it and answers
  -- whether fn ran on the coroutine the handler's thread began on.
  -- ngx_lua gives the coroutine of a thread that ended to the worker's
  -- next thread, but only the coroutine a request's handler began on (its
  -- entry thread), and only when a thread on it ended by itself, never
  -- when it was killed (see redislock/ngx_lease.lua's sentinel). Here fn
  -- runs on the coroutine the handler's thread left (the answer says so):
  -- the one that ngx_lua would give again. The light thread started at
  -- once after the kill, and the request sent just after it, take the
  -- coroutines ngx_lua keeps; had one of them fn's, the sentinel would
  -- read that thread's status and keep renewing the lock while it runs.
  -- The lock goes back at the sentinel's next step and the lease's next
  -- renewal (2 s and a third of the TTL after fn began), while the other
  -- thread still runs (until 4.05 s); the request ends with that thread,
  -- not at the sentinel's next step after it.
  it("gives back a killed fn thread's lock while the next threads run", function()
    local c = send("/reused?key=k2")
    assert(helpers.eventually(5, function() return servers[1]:cli("EXISTS", "lock:{k2}") == "1" end))
    local held = socket.gettime()
    socket.sleep(1.4)
    local other = send("/sleep?s=4")
    local gone = helpers.eventually(3, function() return servers[1]:cli("EXISTS", "lock:{k2}") == "0" end)
    local gone_at = socket.gettime() - held
    local answer = assert(c:receive("*a"))
    c:close()
    local took = socket.gettime() - held
    assert.matches("on the handler's coroutine, killed", answer, 1, true)
    assert(gone and gone_at < 3.5, string.format("the lock outlived its thread: %s %.3f s after fn began%s",
                                                  gone and "gone" or "still there", gone_at, nginx:error_log()))
    assert(took < 4.7, string.format("the request took %.3f s after fn began%s", took, nginx:error_log()))
    assert(other:receive("*a"))
    other:close()
  end)
end)
