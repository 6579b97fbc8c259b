-- SPDX-License-Identifier: MIT
-- The documentation: the API reference builds from the code's doc comments
-- without a warning (make docs, LDoc), and every link of the front page,
-- the pages under docs/ and the OpenResty example's README resolves, to a
-- file and to a heading (tools/check_links.lua).
local helpers = require("spec.helpers")

describe("the documentation", function()
  local root = helpers.sh_quote(helpers.spec_dir .. "..")

  it("builds the API reference with LDoc without a warning", function()
    local dir = helpers.tmpdir()
    local out, ok = helpers.run("cd " .. root .. " && ldoc -d " .. helpers.sh_quote(dir) .. " . 2>&1")
    assert.is_true(ok, out)
    local rest = out:gsub("reading configuration from config.ld\n", ""):gsub("output written to [^\n]*\n", "")
    assert.are.equal("", rest)
    for _, page in ipairs({ "index.html", "modules/redislock.election.html", "modules/redislock.client.html" }) do
      assert.is_truthy(io.open(dir .. "/" .. page), page .. " not written: " .. out)
    end
    -- The comments' placeholders are text in the HTML, not tags it drops.
    for page, text in pairs({
      ["modules/redislock.election.html"] = '"election:&lt;name&gt;"',
      ["modules/redislock.rwlock.html"] = "&lt;prefix&gt;{&lt;name&gt;}:rw:readers",
      ["modules/redislock.client.html"] = '"redis: &lt;server error&gt;"',
      ["modules/redislock.lock.html"] = "local lock &lt;close&gt;",
    }) do
      local html = helpers.read_file(dir .. "/" .. page) or ""
      assert.is_truthy(html:find(text, 1, true), page .. " lacks " .. text)
    end
    os.execute("rm -rf " .. helpers.sh_quote(dir))
  end)

  it("has no broken link in README.md and docs/", function()
    local out, ok = helpers.run("cd " .. root .. " && " .. helpers.lua .. " tools/check_links.lua README.md docs/*.md "
                                .. "examples/openresty/README.md 2>&1")
    assert.is_true(ok, out)
    assert.matches("^links: ok %(%d+ links in %d+ files%)\n$", out)
  end)

  it("has a manual page for the command that renders cleanly and names all that --help names", function()
    local page = helpers.spec_dir .. "../docs/redislock.1"
    -- man's own warnings (groff's -ww), with the output thrown away.
    local out, ok = helpers.run("LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l " .. helpers.sh_quote(page)
                                .. " 2>&1 >/dev/null")
    assert.is_true(ok, out)
    assert.are.equal("", out)
    local text = helpers.read_file(page)
    assert.matches('\n%.TH REDISLOCK 1 %d+%-%d+%-%d+ "redislock ' .. require("redislock")._VERSION:gsub("%.", "%%.")
                   .. '"', text)
    local usage
    usage, ok = helpers.run(helpers.lua .. " " .. helpers.sh_quote(helpers.spec_dir .. "../bin/redislock") .. " --help")
    assert.is_true(ok, usage)
    -- roff writes a hyphen of an option as \-.
    local roff = text:gsub("\\%-", "-")
    local n = 0
    for option in usage:gmatch("%f[%w-](%-%-?[%a][%w-]*)") do
      n = n + 1
      assert.is_truthy(roff:find(option, 1, true), option .. " is in --help, not in the manual page")
    end
    assert.is_true(n >= 20, usage)
    -- Each exit status --help names, in the page's EXIT STATUS section.
    local statuses = roff:match("\n%.SH EXIT STATUS\n(.-)\n%.SH ")
    assert.is_truthy(statuses, "no EXIT STATUS section")
    local named = 0
    for status in usage:match("\nexit status:(.-)\n\n"):gmatch("%f[%d](%d+)%f[%D]") do
      named = named + 1
      assert.is_truthy(statuses:find("%f[%d]" .. status .. "%f[%D]"), "exit status " .. status .. " is not in the page")
    end
    assert.is_true(named >= 8, usage)
    for var in usage:gmatch("REDISLOCK_[%u_]+") do
      assert.is_truthy(roff:find(var, 1, true), var .. " is in --help, not in the manual page")
    end
  end)

  it("keeps the front page short: about 300 lines at most", function()
    local n = 0
    for _ in io.lines(helpers.spec_dir .. "../README.md") do n = n + 1 end
    assert.is_true(n <= 300, "README.md has " .. n .. " lines")
  end)
end)

-- The Lua blocks of README.md and docs/*.md. A block whose fence says
-- ```lua runnable is a whole program for one Redis server at
-- 127.0.0.1:6379 (the default): it is run against this spec's server, so a
-- page never drifts from the code. The others (Sentinel, Cluster, Redlock,
-- TLS: other machines) must at least be Lua that compiles. A block fenced
-- ```nginx runnable is an http { } block whose locations answer 200 to a
-- GET: it runs in a private nginx (LuaJIT pass) against this spec's
-- server, with the checkout for /path/to/redislock.
local function lua_blocks()
  local blocks = {}
  local root = helpers.spec_dir .. "../"
  local files = { "README.md" }
  for name in helpers.run("cd " .. helpers.sh_quote(root) .. " && ls docs/*.md"):gmatch("%S+") do
    files[#files + 1] = name
  end
  for _, name in ipairs(files) do
    local n, block = 0, nil
    for line in io.lines(root .. name) do
      n = n + 1
      if block then
        if line:match("^```%s*$") then
          blocks[#blocks + 1], block = block, nil
        else
          block.code[#block.code + 1] = line
        end
      else
        local lang, info = line:match("^```(%a+)(.*)$")
        local runnable = info and info:match("^%s+runnable%s*$") ~= nil
        if lang == "lua" or (lang == "nginx" and runnable) then
          block = { where = name .. ":" .. n, runnable = runnable, nginx = lang == "nginx", code = {} }
        end
      end
    end
  end
  return blocks
end

describe("the documentation's Lua blocks", function()
  local srv
  lazy_setup(function() srv = helpers.start_redis() end)
  lazy_teardown(function() srv:stop() end)

  local blocks = lua_blocks()
  local runnable = 0
  for _, b in ipairs(blocks) do
    local code = table.concat(b.code, "\n") .. "\n"
    if b.nginx then
      runnable = runnable + 1
      local run = jit and it or pending -- luacheck: ignore (jit)
      run(b.where .. " runs in nginx", function()
        srv:cli("FLUSHALL")
        -- The block's own http { }, its paths the checkout's (start_nginx
        -- sets them: the block's lines go), a listen for each server.
        local http = code:match("^%s*http%s*{(.*)}%s*$")
        assert.is_truthy(http, b.where .. " is not an http { } block")
        local paths = 0
        http = http:gsub("\n%s*lua_package_c?path%s+\"/path/to/redislock/([^\"]*)\";", function(rest)
          paths = paths + 1
          local dir = rest:match("^(.*)/%?%.[%a]+;;$")
          assert.is_truthy(dir and io.open(helpers.root() .. "/" .. dir), b.where .. ": no such path " .. rest)
          return ""
        end)
        assert.are.equal(2, paths, b.where .. " sets no lua_package_path and lua_package_cpath")
        http = http:gsub("(\n%s*server%s*{)", "%1\n    listen 127.0.0.1:{{port}};")
        local nginx = helpers.start_nginx({ workers = 1, main = "env REDIS_URL=" .. srv.url .. ";", http = http })
        local requests = require("spec.support.http")
        local ok, err = pcall(function()
          local asked = 0
          for location in http:gmatch("location%s*=?%s*(/%S*)%s*{") do
            asked = asked + 1
            local status, body = requests.request(nginx.port, "GET", location, { timeout = 30 })
            assert(status == 200, location .. " answered " .. status .. ": " .. body .. nginx:error_log())
            -- An error of ours, passed on as the page's text (busy: ..., bad argument ...).
            assert(not body:match("^%a+: ") and not body:match("bad argument"), location .. " answered " .. body)
          end
          assert(asked > 0, b.where .. ": no location to ask")
        end)
        nginx:stop()
        assert(ok, err)
      end)
    elseif b.runnable then
      runnable = runnable + 1
      -- <close> is Lua 5.4's: LuaJIT runs the others.
      local run = jit and code:find("<close>", 1, true) and pending or it -- luacheck: ignore (jit)
      run(b.where .. " runs", function()
        srv:cli("FLUSHALL")
        local file = helpers.tmpdir() .. "/block.lua"
        local f = assert(io.open(file, "w"))
        f:write((code:gsub("127%.0%.0%.1:6379", "127.0.0.1:" .. srv.port)))
        f:close()
        local out, ok = helpers.run("REDIS_URL=" .. helpers.sh_quote(srv.url) .. " " .. helpers.lua .. " "
                                    .. helpers.sh_quote(file) .. " 2>&1")
        assert.is_true(ok, b.where .. ":\n" .. out)
        os.execute("rm -rf " .. helpers.sh_quote(file:match("^(.*)/")))
      end)
    elseif not jit then -- luacheck: ignore (jit)
      it(b.where .. " compiles", function()
        local fn, err = load(code, "=" .. b.where)
        assert.is_truthy(fn, err)
      end)
    end
  end

  -- The reference is whole (tools/ldoc_check.lua), and it documents every
  -- method of every object a user holds, and every option the code takes.
  it("documents every public function, method and option in the API reference", function()
    local out, ok = helpers.run("cd " .. helpers.sh_quote(helpers.spec_dir .. "..")
                                .. " && LUA_PATH='tools/?.lua;;' ldoc --filter ldoc_check.check . 2>&1")
    assert.is_true(ok, out)
    assert.matches("\nreference: ok %(%d+ items%)\n$", out)
    local items, fields = {}, {}
    local lines = "\n" .. out
    for module, name in lines:gmatch("\nitem (%S+) (%S+)") do items[module .. " " .. name] = true end
    for tbl, field in lines:gmatch("\nfield %S+ (%S+) (%S+)") do
      fields[tbl] = fields[tbl] or {}
      fields[tbl][field] = true
    end
    local client = srv:client()
    local lock = assert(client:acquire("reference", 5))
    local election = client:election("reference")
    local objects = {
      Client = client, Lock = lock, MultiLock = assert(client:acquire({ "reference:a", "reference:b" }, 5)),
      Semaphore = client:semaphore("reference", 2), RWLock = client:rwlock("reference"), Election = election,
      Leadership = assert(election:campaign("here", 5)), Guard = lock:fenced(),
    }
    -- A method is documented in its class's module, or (Lock:fenced, Lock:owned) in redislock.guard.
    local home = { Client = "redislock.client", Lock = "redislock.lock", MultiLock = "redislock.multilock",
                   Semaphore = "redislock.semaphore", RWLock = "redislock.rwlock", Election = "redislock.election",
                   Leadership = "redislock.leadership", Guard = "redislock.guard" }
    local n = 0
    for class, object in pairs(objects) do
      for name, value in pairs(getmetatable(object).__index) do
        if type(value) == "function" and not name:match("^_") then
          n = n + 1
          local item = class .. ":" .. name
          assert.is_truthy(items[home[class] .. " " .. item] or items["redislock.guard " .. item],
                           item .. " is not in the API reference")
        end
      end
    end
    assert.is_true(n >= 40, n .. " methods")
    for _, module in ipairs({ "redislock", "redislock.sql", "redislock.resty_lock" }) do
      for name, value in pairs(require(module)) do
        if type(value) == "function" then
          assert.is_truthy(items[module .. " " .. name], module .. "." .. name .. " is not in the API reference")
        end
      end
    end
    local options = {
      client_options = require("redislock.client").OPTIONS, lock_options = require("redislock.args").OPTIONS,
      tls_options = require("redislock.tls").OPTIONS, observe_options = require("redislock.observe").OPTIONS,
      every_options = require("redislock.ngx_every").OPTIONS,
      resty_lock_options = require("redislock.resty_lock").OPTIONS,
    }
    for tbl, names in pairs(options) do
      assert.is_truthy(fields[tbl], tbl .. " is not in the API reference")
      for name in pairs(names) do
        assert.is_truthy(fields[tbl][name], "option " .. name .. " is not in the reference's " .. tbl)
      end
      for name in pairs(fields[tbl]) do
        assert.is_truthy(names[name], tbl .. " documents " .. name .. ", which the code does not take")
      end
    end
    client:close()
  end)

  it("has runnable blocks", function()
    assert.is_true(runnable >= 15, runnable .. " runnable blocks")
  end)
end)
