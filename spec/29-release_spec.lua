-- SPDX-License-Identifier: MIT
-- run.sh: long 105 (its seconds on a loaded 2-core machine: spec/run.sh starts it early; make check skips it)
-- The release as users install it: `make rock` packs the release rockspec
-- and its archive into a source rock, and `luarocks install <file>` builds
-- it offline into a fresh tree, for the interpreter running the suite (Lua
-- 5.4; LuaJIT as 5.1, with luajit as the command's interpreter). A lock is
-- then taken through the installed modules, and through the installed
-- `redislock` command.
local helpers = require("spec.helpers")
local redislock = require("redislock")

describe("the release", function()
  local srv

  helpers.redis_for(function(s) srv = s end)

  it("installs from its source rock with luarocks install, offline, and locks through it", function()
    local q = helpers.sh_quote
    local root = helpers.spec_dir .. ".."
    local dir = (helpers.run("mktemp -d"):gsub("%s+$", ""))
    local version = redislock._VERSION
    local out, ok = helpers.run("cd " .. q(root) .. " && ROCK_DIR=" .. q(dir) .. " sh tools/rock.sh")
    assert.is_true(ok, out)
    local rock = dir .. "/redislock-" .. version .. "-1.src.rock"
    local listing = helpers.run("unzip -l " .. q(rock))
    assert.matches("redislock%-" .. version:gsub("%.", "%%.") .. "%-1%.rockspec", listing)
    assert.matches("v" .. version:gsub("%.", "%%.") .. "%.tar%.gz", listing)
    -- LuaJIT: built against its headers, and the command run by luajit
    -- (Debian's luarocks would name lua5.1).
    local lua_version, env = "5.4", ""
    if jit then -- luacheck: ignore (jit)
      lua_version = "5.1"
      local f = assert(io.open(dir .. "/luajit.lua", "w"))
      f:write('lua_interpreter = "luajit"\n',
              'variables = { LUA_BINDIR = "/usr/bin", LUA_INCDIR = "/usr/include/luajit-2.1" }\n')
      f:close()
      env = "LUAROCKS_CONFIG=" .. q(dir .. "/luajit.lua") .. " "
    end
    local tree = dir .. "/tree"
    out, ok = helpers.run("cd " .. q(dir) .. " && " .. env .. "luarocks --lua-version=" .. lua_version
                          .. " --tree=" .. q(tree) .. " install " .. q(rock))
    assert.is_true(ok, out)
    assert.matches("redislock " .. version:gsub("%.", "%%.") .. "%-1 is now installed", out)
    -- The modules, from the tree only.
    local check = [[
      local redislock = require("redislock")
      assert(package.searchpath("redislock.core", package.cpath):find("/tree/", 1, true))
      assert(package.searchpath("redislock.semaphore", package.path):find("/tree/", 1, true))
      local client = redislock.new({ port = ]] .. srv.port .. [[ })
      local lock = assert(client:acquire("release", 5))
      assert(client:semaphore("release:pool", 2):with_permit(5, function() return true end))
      assert(lock:release())
      print("locked " .. redislock._VERSION .. " fence " .. lock.fence)
    ]]
    out, ok = helpers.run("cd " .. q(dir) .. " && unset LUA_PATH LUA_CPATH LUA_PATH_5_4 LUA_CPATH_5_4 && eval \"$("
                          .. env .. "luarocks --lua-version=" .. lua_version .. " --tree=tree path)\" && "
                          .. helpers.lua .. " -e " .. q(check))
    assert.is_true(ok, out)
    assert.matches("^locked " .. version:gsub("%.", "%%.") .. " fence %d+\n$", out)
    -- The command, as installed (a wrapper that finds the tree by itself).
    out, ok = helpers.run("cd / && unset LUA_PATH LUA_CPATH LUA_PATH_5_4 LUA_CPATH_5_4 && REDIS_URL=" .. q(srv.url)
                          .. " " .. q(tree .. "/bin/redislock") .. " run release -- sh -c 'echo ran-$REDISLOCK_FENCE'")
    assert.is_true(ok, out)
    assert.matches("^ran%-%d+\n$", out)
    out, ok = helpers.run(q(tree .. "/bin/redislock") .. " --version")
    assert.is_true(ok, out)
    assert.are.equal("redislock " .. version .. "\n", out)
    -- The manual page and the documentation, in the rock's folder.
    local rock_dir = helpers.run("cd " .. q(dir) .. " && " .. env .. "luarocks --lua-version=" .. lua_version
                                 .. " --tree=tree show --rock-dir redislock"):gsub("%s+$", "")
    local man = io.open(rock_dir .. "/docs/redislock.1")
    assert.is_truthy(man, "no docs/redislock.1 in " .. rock_dir)
    assert.matches('^%.\\".-\n%.TH REDISLOCK 1 %S+ "redislock ' .. version:gsub("%.", "%%.") .. '"', man:read("*a"))
    man:close()
    os.execute("rm -rf " .. q(dir))
  end)
end)
