-- SPDX-License-Identifier: MIT
-- run.sh: alone (its bounds on when the job moves want no other spec file beside it)
-- election:every under OpenResty (redislock/ngx_every.lua): two nginx
-- instances of two workers each start one recurring job from
-- init_worker_by_lua; it runs on one worker at a time (a counter of the
-- runs in progress, and the runs' record in order), and moves when its
-- worker is killed or its nginx is stopped, with a larger term.
local helpers = require("spec.helpers")
local http = require("spec.support.http")
local socket = require("socket")

-- The job's interval and its leadership's TTL (seconds).
local INTERVAL, TTL = 0.2, 2

describe("election:every under OpenResty", function()
  if helpers.no_nginx(pending) then return end
  local srv, raw

  helpers.redis_for(function(s, r) srv, raw = s, r end)

  -- An nginx whose workers each start the job. A run counts on "inside"
  -- the runs in progress ("overlaps" when more than one), and once done
  -- says which nginx (its port), worker and term, and when it began and
  -- ended (epoch seconds, by nginx's clock).
  local function start()
    return helpers.start_nginx({
      workers = 2,
      http = table.concat({
        "lua_socket_log_errors off;",
        "init_worker_by_lua_block {",
        '  local client = require("redislock").new({ port = ' .. srv.port .. " })",
        "  package.loaded.every_client = client",
        '  assert(client:election("refresh"):every(' .. INTERVAL .. ", function(term, lead)",
        "    ngx.update_time()",
        "    local start = ngx.now()",
        '    if client:command("INCR", "inside") > 1 then client:command("INCR", "overlaps") end',
        "    ngx.sleep(0.05)",
        '    client:command("DECR", "inside")',
        "    ngx.update_time()",
        '    local run = string.format("{{port}} %d %.0f %.3f %.3f", ngx.worker.pid(), term, start, ngx.now())',
        '    client:command("RPUSH", "runs", run)',
        "  end, { ttl = " .. TTL .. " }))",
        "}",
        "server {",
        "  listen 127.0.0.1:{{port}};",
        "  location = /ping { return 200; }",
        "  location = /twice { content_by_lua_block {",
        '    local e = package.loaded.every_client:election("refresh")',
        "    ngx.say(select(2, pcall(e.every, e, 1, function() end)))",
        "  } }",
        "  location = /leader { content_by_lua_block {",
        '    local l = assert(package.loaded.every_client:election("refresh"):leader())',
        '    ngx.say(l.value, " ", string.format("%.0f", l.term))',
        "  } }",
        "  location = /observe { content_by_lua_block {",
        '    assert(package.loaded.every_client:election("refresh"):observe(function(l)',
        '      ngx.say(l and l.value or "none", " ", l and string.format("%.0f", l.term) or "")',
        "    end, { wait = 6 }))",
        "  } }",
        "}",
      }, "\n"),
    })
  end

  -- The runs done so far: { nginx (port), pid, term, at (its start), done },
  -- in order.
  local function runs()
    local list = {}
    for _, r in ipairs(raw:command("LRANGE", "runs", 0, -1)) do
      local port, pid, term, at, done = r:match("^(%d+) (%d+) (%d+) ([%d.]+) ([%d.]+)$")
      list[#list + 1] = { nginx = tonumber(port), pid = tonumber(pid), term = tonumber(term), at = tonumber(at),
                          done = tonumber(done) }
    end
    return list
  end

  -- Checks that the runs never overlapped (the counter, until a run was
  -- killed in progress; and the times) and went from one worker to the
  -- next with a larger term; returns them.
  local function checked(counted)
    if counted then assert.are.equal(0, tonumber(raw:command("GET", "overlaps") or 0)) end
    local list = runs()
    for i = 2, #list do
      local a, b = list[i - 1], list[i]
      assert.is_true(b.at >= a.done, string.format("a run from %.3f to %.3f, the next from %.3f", a.at, a.done, b.at))
      if a.pid ~= b.pid then
        assert.is_true(b.term > a.term, string.format("worker %d (term %d) after worker %d (term %d)",
                                                      b.pid, b.term, a.pid, a.term))
      else
        assert.are.equal(a.term, b.term)
      end
    end
    return list
  end

  -- The first run after `since` (epoch seconds) by a worker other than pid.
  local function moved(since, pid)
    local found
    helpers.eventually(TTL + 3, function()
      for _, r in ipairs(runs()) do
        if r.at > since and r.pid ~= pid then
          found = r
          return true
        end
      end
      return false
    end)
    return found
  end

  it("runs the job on one worker of one nginx at a time, and moves it when its worker or nginx goes", function()
    assert.are.equal("OK", raw:command("FLUSHALL"))
    local one, two = start(), start()
    local ok, err = pcall(function()
      helpers.eventually(5, function() return #runs() >= 8 end)
      local list = checked(true)
      assert.is_true(#list >= 8, "runs: " .. #list)
      -- A second job for the same election on the same client is refused.
      local status, body = http.request(one.port, "GET", "/twice")
      assert.are.equal(200, status)
      assert.matches("bad self to 'every' %(this client runs a job for election \"refresh\" already%)", body)
      -- leader() and observe() over cosockets: the job's worker leads (the
      -- default value ends with its PID), and an observer hears a move.
      local leader = runs()[#runs()]
      status, body = http.request(one.port, "GET", "/leader")
      assert.are.equal(200, status)
      assert.are.equal("/" .. leader.pid .. " " .. leader.term, body:match("/%d+ %d+"), body)
      local observer = http.start(leader.nginx == one.port and two.port or one.port, "GET", "/observe")
      assert.is_truthy(helpers.eventually(5, function()
        return raw:command("ZCARD", "lock:{election:refresh}:observers") == 1
      end), "the observer never registered")
      -- All on one worker while every worker lives.
      for _, r in ipairs(list) do assert.are.equal(list[1].pid, r.pid) end
      -- Its worker killed: another takes the job over within the TTL and a
      -- campaigner's block (nginx starts a new worker meanwhile).
      leader = list[#list]
      local killed = socket.gettime()
      assert.is_true(helpers.sh_ok("kill -KILL " .. leader.pid))
      local next_run = moved(killed, leader.pid)
      assert.is_truthy(next_run, "the job never moved after its worker was killed")
      assert.is_true(next_run.at - killed <= TTL + 1.5, string.format("moved %.3f s after", next_run.at - killed))
      assert.is_true(next_run.term > leader.term)
      -- The observer (6 s from before the kill) heard the old leader, then the new one.
      status, body = observer:finish()
      assert.are.equal(200, status)
      assert.is_truthy(body:find("/" .. leader.pid .. " " .. leader.term .. "\n", 1, true), body)
      assert.is_truthy(body:find("/" .. next_run.pid .. " " .. next_run.term .. "\n", 1, true), body)
      -- Its nginx stopped (gracefully): the worker resigns, and the job moves
      -- to the other nginx at once.
      helpers.eventually(2, function() return #runs() >= #checked() + 3 end)
      leader = runs()[#runs()]
      local stopping = leader.nginx == one.port and one or two
      local other = stopping == one and two or one
      local stopped = socket.gettime()
      stopping:stop()
      next_run = moved(stopped, leader.pid)
      assert.is_truthy(next_run, "the job never moved after its nginx stopped")
      assert.are.equal(other.port, next_run.nginx)
      assert.is_true(next_run.at - stopped <= 1, string.format("moved %.3f s after", next_run.at - stopped))
      helpers.eventually(2, function() return #runs() >= #checked() + 3 end)
      checked()
    end)
    local log = one:error_log() .. two:error_log()
    one:stop()
    two:stop()
    assert.is_true(ok, tostring(err) .. "\n" .. log)
    assert.is_nil(log:find("raised", 1, true), log)
  end)
end)
