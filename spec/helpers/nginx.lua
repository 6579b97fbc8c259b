-- SPDX-License-Identifier: MIT
-- spec/helpers.lua's nginx: a private nginx with lua-nginx-module on a free
-- port, its configuration filled in from a template (helpers.start_nginx),
-- its workers, error log and stop.

return function(helpers)
  local tmpdir, alive, run, sh_quote, read_file = helpers.tmpdir, helpers.alive, helpers.run, helpers.sh_quote,
        helpers.read_file

  -- Replaces every literal "{{name}}" in s by vars[name]; other text, Lua's
  -- `{{x}}` included, is left alone.
  local function fill(s, vars)
    return (s:gsub("{{(%w+)}}", vars))
  end

  -- PIDs of a process's children (nginx's workers, for the master).
  local function children(pid)
    local out = run("pgrep -P " .. pid)
    local pids = {}
    for p in out:gmatch("%d+") do pids[#pids + 1] = tonumber(p) end
    return pids
  end

  -- Quotes a path for nginx.conf.
  local function ngx_quote(s)
    return '"' .. s:gsub('[\\"]', "\\%0") .. '"'
  end

  -- A server block on {{port}} (listening with reuseport if asked): its
  -- server_name lines.name, if any, then the lines (directives,
  -- helpers.location(...)).
  local function server_block(lines, reuseport)
    local out = { "server {", "  listen 127.0.0.1:{{port}}" .. (reuseport and " reuseport" or "") .. ";" }
    if lines.name then out[#out + 1] = "  server_name " .. lines.name .. ";" end
    for _, line in ipairs(lines) do out[#out + 1] = "  " .. line end
    out[#out + 1] = "}"
    return table.concat(out, "\n")
  end

  -- The nginx.conf for one instance: Debian's lua module, everything nginx writes
  -- under the prefix, our Lua code and the LuaJIT build of the C core on the paths.
  local function nginx_conf(prefix, vars, opts)
    local root = helpers.root()
    local cdir = os.getenv("REDISLOCK_NGX_CPATH_DIR") or (root .. "/build/luajit")
    local lines = {
      "# Written by spec/helpers.lua (start_nginx).",
      "load_module /usr/lib/nginx/modules/ndk_http_module.so;",
      "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;",
      -- As root the workers would run as nobody, who cannot enter the 0700
      -- prefix nor, maybe, the checkout.
      run("id -u"):match("^0%s") and "user root;" or "",
      "worker_processes " .. (opts.workers or 2) .. ";",
      "daemon on;",
      "master_process on;",
      "pid " .. ngx_quote(prefix .. "/nginx.pid") .. ";",
      "error_log " .. ngx_quote(prefix .. "/logs/error.log") .. " " .. (opts.log_level or "info") .. ";",
      fill(opts.main or "", vars),
      "events { worker_connections " .. (opts.worker_connections or 1024) .. "; }",
      "http {",
      "  access_log off;",
    }
    for _, kind in ipairs({ "client_body", "proxy", "fastcgi", "uwsgi", "scgi" }) do
      lines[#lines + 1] = "  " .. kind .. "_temp_path " .. ngx_quote(prefix .. "/temp/" .. kind) .. ";"
    end
    lines[#lines + 1] = "  lua_package_path " .. ngx_quote(root .. "/lua/?.lua;" .. root .. "/?.lua;;") .. ";"
    lines[#lines + 1] = "  lua_package_cpath " .. ngx_quote(cdir .. "/?.so;;") .. ";"
    local http = opts.http or ""
    lines[#lines + 1] = fill(type(http) == "table" and table.concat(http, "\n") or http, vars)
    for _, server in ipairs(opts.servers or { opts.server }) do
      lines[#lines + 1] = fill(server_block(server, opts.reuseport), vars)
    end
    lines[#lines + 1] = "}"
    return table.concat(lines, "\n") .. "\n"
  end

  local Nginx = {}
  Nginx.__index = Nginx

  --- Starts a private nginx with the lua module (daemon, by PID) on a free
  -- loopback port. opts.http: config placed inside http { } after our defaults
  -- (a string, or a list of lines); opts.server: a server block's lines, on
  -- {{port}} (listen ... reuseport with opts.reuseport; server_name from the
  -- list's field name), or opts.servers, a list of them, after opts.http;
  -- opts.main: more main-context lines (e.g. `env REDIS_URL;`);
  -- in all of them, {{port}}, {{port2}} (a second free port), {{root}} (the checkout) and
  -- {{prefix}} are replaced. opts.workers (2), opts.worker_connections (1024),
  -- opts.log_level ("info"). Returns an object with port, port2, prefix, pid and
  -- :stop(), :error_log(), :url(path), :workers(); raises when nginx cannot start.
  function helpers.start_nginx(opts)
    opts = opts or {}
    local failure = ""
    for _ = 1, 5 do
      local prefix = tmpdir()
      local vars = { port = tostring(helpers.free_port()), port2 = tostring(helpers.free_port()),
                     root = helpers.root(), prefix = prefix }
      run("mkdir -p " .. sh_quote(prefix .. "/conf") .. " " .. sh_quote(prefix .. "/logs") .. " "
          .. sh_quote(prefix .. "/temp"))
      local conf = prefix .. "/conf/nginx.conf"
      local f = assert(io.open(conf, "w"))
      f:write(nginx_conf(prefix, vars, opts))
      f:close()
      -- Output to a file: a daemon holding popen's pipe would make run() wait.
      -- LUA_PATH/LUA_CPATH would leak into the lua module's ";;" (the suite's
      -- build folder may be the lua5.4 one).
      local out_file = prefix .. "/logs/nginx.out"
      local _, started = run("env -u LUA_PATH -u LUA_CPATH nginx -p " .. sh_quote(prefix .. "/")
                             .. " -c " .. sh_quote(conf) .. " > " .. sh_quote(out_file) .. " 2>&1")
      local port = tonumber(vars.port)
      local pid
      local up = started and helpers.eventually(5, function()
        pid = tonumber(read_file(prefix .. "/nginx.pid") or "")
        return pid and alive(pid) and helpers.accepts(port)
      end)
      if up then
        return setmetatable({ port = port, port2 = tonumber(vars.port2), prefix = prefix, pid = pid }, Nginx)
      end
      local log = (read_file(out_file) or "") .. (read_file(prefix .. "/logs/error.log") or "")
      failure = "nginx output and error.log:\n" .. log .. "\nnginx.conf:\n" .. (read_file(conf) or "")
      setmetatable({ prefix = prefix, pid = pid }, Nginx):stop()
      if not log:find("Address already in use", 1, true) then break end
    end
    error("cannot start nginx; " .. failure)
  end

  --- Stops nginx: SIGQUIT (graceful, waits for requests in flight), then SIGTERM,
  -- then SIGKILL for the master and its workers; removes the prefix. Idempotent.
  function Nginx:stop()
    if self.pid then
      for _, sig in ipairs({ "QUIT", "TERM" }) do
        if alive(self.pid) then
          os.execute("kill -" .. sig .. " " .. self.pid .. " 2>/dev/null")
          helpers.eventually(sig == "QUIT" and 5 or 2, function() return not alive(self.pid) end)
        end
      end
      if alive(self.pid) then
        -- A master killed outright leaves its workers running, orphaned.
        local workers = children(self.pid)
        os.execute("kill -9 " .. self.pid .. " 2>/dev/null")
        for _, w in ipairs(workers) do os.execute("kill -9 " .. w .. " 2>/dev/null") end
      end
      self.pid = nil
    end
    if self.prefix then
      os.execute("rm -rf " .. sh_quote(self.prefix))
      self.prefix = nil
    end
  end

  --- The text of logs/error.log so far ("" once stopped).
  function Nginx:error_log()
    return self.prefix and read_file(self.prefix .. "/logs/error.log") or ""
  end

  --- The URL of path on this nginx (path starts with "/").
  function Nginx:url(path)
    return "http://127.0.0.1:" .. self.port .. (path or "/")
  end

  --- The worker processes' PIDs right now.
  function Nginx:workers()
    return self.pid and children(self.pid) or {}
  end

  --- An nginx (2 workers) whose /primitive runs spec/support/ngx_app.lua's
  -- primitive handler (a semaphore, read-write or multi-key hold per
  -- request) against the redis-server srv.
  function helpers.start_primitive_nginx(srv)
    return helpers.start_nginx({
      workers = 2,
      http = "lua_socket_log_errors off;",
      server = { helpers.redis_vars(srv), helpers.location("/primitive", "primitive") },
    })
  end

  --- Runs spec/support/ngx_app.lua's /election on nginx twice (a
  -- topology's instance, with that location): each time a campaign, who
  -- leads, a proclaim, an observer and a resign answered as they should,
  -- and the second term above the first. Raises otherwise.
  function Nginx:elections()
    local http = require("spec.support.http")
    local last = 0
    for _ = 1, 2 do
      local status, body = http.request(self.port, "GET", "/election?name=o:elected")
      assert(status == 200, body .. self:error_log())
      local term, before, after, heard = body:match("^(%d+) (%S+) (%S+) (%S+)")
      assert(before == "a" and after == "b" and heard == "b", body)
      assert(tonumber(term) > last, body)
      last = tonumber(term)
    end
  end

  --- Sends n requests at once to /counter?lock=mode (ngx_app's counter: a
  -- read-modify-write of the key "counter" under with_lock), the keys it
  -- counts on deleted first through data (a client, or a core client, of
  -- its server); raises unless every answer is 200, the counter reads n
  -- and no two requests overlapped. Returns how many workers answered.
  function Nginx:counter(n, mode, data)
    for _, k in ipairs({ "counter", "inside", "overlaps" }) do assert(data:command("DEL", k)) end
    local reqs = {}
    for i = 1, n do reqs[i] = "/counter?lock=" .. mode end
    local workers, count = {}, 0
    for i, res in ipairs(require("spec.support.http").parallel(self.port, reqs, { timeout = 120 * helpers.slow })) do
      assert(res.status == 200, "request " .. i .. " answered " .. tostring(res.status) .. ": " .. res.body
                                .. self:error_log())
      local worker = res.headers["x-worker"]
      if worker and not workers[worker] then workers[worker], count = true, count + 1 end
    end
    local counter = data:command("GET", "counter")
    assert(counter == tostring(n), "the counter reads " .. tostring(counter))
    assert(data:command("GET", "overlaps") == false, "requests overlapped")
    return count
  end

  --- Sends every path to nginx at once; raises unless every answer is 200.
  -- Returns the results (spec/support/http.lua's).
  function Nginx:all_ok(paths)
    local results = require("spec.support.http").parallel(self.port, paths, { timeout = 60 })
    for i, r in ipairs(results) do
      assert(r.status == 200, "request " .. i .. " answered " .. tostring(r.status) .. ": " .. r.body
                              .. self:error_log())
    end
    return results
  end


  -- The server block every instance gets; %s are the redis URLs.
  local function server_conf(url, dead_url, unix_url, auth_url, badauth_url)
    return table.concat({
      "lua_socket_log_errors off;",
      "server {",
      "  listen 127.0.0.1:{{port}} reuseport;",
      '  set $redis_url "' .. url .. '";',
      '  set $redis_timeout "";',
      helpers.location("/counter", "counter"),
      helpers.location("/acquire", "acquire"),
      helpers.location("/reenter", "reenter"),
      helpers.location("/release", "release"),
      helpers.location("/ping", "ping"),
      helpers.location("/with_lock", "with_lock"),
      helpers.location("/module", "module"),
      helpers.location("/raise", "raise"),
      helpers.location("/raise_table", "raise_table"),
      helpers.location("/leave", "leave"),
      helpers.location("/drop", "drop"),
      '  location = /guarded { access_by_lua_block { require("spec.support.ngx_app").leave() }',
      '                        content_by_lua_block { ngx.say("not reached") } }',
      helpers.location("/dead/acquire", "acquire", 'set $redis_url "' .. dead_url .. '";'),
      helpers.location("/slow/acquire", "acquire", 'set $redis_timeout 0.2;'),
      helpers.location("/unix/acquire", "acquire", 'set $redis_url "' .. unix_url .. '";'),
      helpers.location("/auth/acquire", "acquire", 'set $redis_url "' .. auth_url .. '";'),
      helpers.location("/badauth/acquire", "acquire", 'set $redis_url "' .. badauth_url .. '";'),
      "  location = /phase {",
      '    content_by_lua_block { ngx.say("body") }',
      '    header_filter_by_lua_block { require("spec.support.ngx_app").header_filter() }',
      '    log_by_lua_block { require("spec.support.ngx_app").log() }',
      "  }",
      "}",
    }, "\n")
  end

  --- Starts nginx with `workers` worker processes in front of the
  -- redis-server srv, serving spec/support/ngx_app.lua's handlers (the
  -- OpenResty side of spec/03, 04 and 05). Its /auth and /badauth paths
  -- log in as the ACL user "locker" (password "s3cret"), which the spec
  -- makes.
  function helpers.start_app_nginx(srv, workers)
    local url = "redis://127.0.0.1:" .. srv.port
    return helpers.start_nginx({
      workers = workers,
      main = "env REDIS_URL=" .. url .. ";",
      http = server_conf(url, "redis://127.0.0.1:" .. helpers.free_port(), "unix://" .. srv.sock,
                         "redis://locker:s3cret@127.0.0.1:" .. srv.port .. "/3",
                         "redis://locker:wrong@127.0.0.1:" .. srv.port),
    })
  end

  --- The app nginx of helpers.start_app_nginx for the enclosing describe
  -- block, in front of the redis-server srv() returns: started in its
  -- lazy_setup (the returned table becomes that nginx, fields and
  -- methods), stopped in its lazy_teardown (a stop is done once).
  function helpers.app_nginx_for(srv, workers)
    local busted, app = require("busted"), {}
    busted.lazy_setup(function()
      local started = helpers.start_app_nginx(srv(), workers)
      for k, v in pairs(started) do app[k] = v end
      setmetatable(app, getmetatable(started))
    end)
    busted.lazy_teardown(function() if getmetatable(app) then app:stop() end end)
    return app
  end

  --- For a spec's "under OpenResty" block: true, after marking the block
  -- pending (pending: busted's), when nginx cannot run in this pass (the
  -- Lua 5.4 one: nginx loads the LuaJIT build of the C core).
  function helpers.no_nginx(pending)
    if jit then return false end
    pending("runs in the LuaJIT pass of make test (nginx loads the LuaJIT build)")
    return true
  end

  --- A server block's line that points spec/support/ngx_app.lua's handlers
  -- at srv (a redis-server of these helpers), with their timeout (seconds)
  -- when one is given.
  function helpers.redis_vars(srv, timeout)
    return 'set $redis_url "redis://127.0.0.1:' .. srv.port .. '";'
           .. (timeout and ' set $redis_timeout "' .. timeout .. '";' or "")
  end

  --- An nginx.conf location running spec/support/ngx_app.lua's handler
  -- name at path, after the directives more.
  function helpers.location(path, name, more)
    return string.format('location = %s { %s content_by_lua_block { require("spec.support.ngx_app").%s() } }',
                         path, more or "", name)
  end
end
