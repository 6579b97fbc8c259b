-- SPDX-License-Identifier: MIT
-- run.sh: long 165 (its seconds on a loaded 2-core machine: spec/run.sh starts it early; make check skips it)
-- `luarocks make` builds and installs the module offline, linking the system
-- hiredis, for the interpreter running the suite (Lua 5.4, or LuaJIT as 5.1).
local helpers = require("spec.helpers")

describe("the rockspec", function()
  it("installs with luarocks make into a fresh tree, and the module loads from it", function()
    local root = helpers.spec_dir .. ".."
    local dir = (helpers.run("mktemp -d"):gsub("%s+$", ""))
    local q = helpers.sh_quote
    local version = jit and "5.1" or _VERSION:match("%d+%.%d+")
    local incdir = jit and "LUA_INCDIR=/usr/include/luajit-2.1" or ""
    -- Build in a copy: luarocks make compiles inside the source tree. (Under
    -- `make asan`, helpers.run keeps the sanitizer runtime away from luarocks.)
    local out, ok = helpers.run(table.concat({
      "cd " .. q(root),
      "cp -R Makefile bin csrc docs lua rockspec " .. q(dir),
      "cd " .. q(dir),
      "make install LUAROCKS=" .. q("luarocks --lua-version=" .. version .. " --tree=" .. q(dir .. "/tree"))
        .. " ROCK_VARS=" .. q(incdir),
    }, " && "))
    assert.is_true(ok, out)
    -- The manual page: in the rock's docs (with the pages), and where man
    -- finds the commands of tree/bin when that is on the PATH.
    local rock_dir = helpers.run("cd " .. q(dir) .. " && luarocks --lua-version=" .. version
                                 .. " --tree=tree show --rock-dir redislock"):gsub("%s+$", "")
    for _, page in ipairs({ "redislock.1", "lock.md", "README.md" }) do
      assert.is_truthy(io.open(rock_dir .. "/docs/" .. page), page .. " not in " .. rock_dir .. "/docs: " .. out)
    end
    local found = helpers.run("env -u MANPATH LC_ALL=C PATH=" .. q(dir .. "/tree/bin") .. ":\"$PATH\" man -w redislock"
                              .. " 2>/dev/null")
    assert.are.equal(dir .. "/tree/share/man/man1/redislock.1\n", found)
    -- Every Lua module of the checkout (lua/redislock.lua, lua/redislock/*.lua)
    -- must come from the tree.
    local files = helpers.run("cd " .. q(root .. "/lua") .. " && find . -name '*.lua' | sort")
    local modules = {}
    for file in files:gmatch("%./(%S+)%.lua") do modules[#modules + 1] = string.format("%q", file:gsub("/", ".")) end
    assert.is_true(#modules >= 8, files)
    local check = [[
      local redislock = require("redislock")
      local core = require("redislock.core")
      assert(package.searchpath("redislock.core", package.cpath):find("/tree/", 1, true))
      for _, m in ipairs({ ]] .. table.concat(modules, ", ") .. [[ }) do
        local where = package.searchpath(m, package.path)
        assert(where and where:find("/tree/", 1, true), m .. " is not installed: " .. tostring(where))
      end
      print(redislock._VERSION, core._VERSION, #core.token())
    ]]
    local loaded, ran = helpers.run("cd " .. q(dir) .. " && eval \"$(luarocks --lua-version=" .. version
      .. " --tree=tree path)\" && " .. helpers.lua .. " -e " .. q(check))
    os.execute("rm -rf " .. q(dir))
    assert.is_true(ran, loaded)
    local v = require("redislock")._VERSION
    assert.are.equal(v .. "\t" .. v .. "\t32\n", loaded)
  end)

  -- The README's way to keep both builds: its LuaJIT config line, a tree
  -- per Lua, Lua 5.4's paths in LUA_PATH_5_4/LUA_CPATH_5_4. Once (LuaJIT pass).
  it("installs the LuaJIT build beside the Lua 5.4 one as the README says, each command and module its own", function()
    if not jit then return end
    local root = helpers.spec_dir .. ".."
    local q = helpers.sh_quote
    local readme = assert(io.open(root .. "/README.md")):read("a")
    local config_line = assert(readme:match("\n(printf 'lua_interpreter = \"luajit\"[^\n]+)\n"),
                               "the README's LuaJIT config line")
    local dir = (helpers.run("mktemp -d"):gsub("%s+$", ""))
    local function sh(...)
      local out, ok = helpers.run("cd " .. q(dir) .. " && " .. table.concat({ ... }, " && ") .. " 2>&1")
      return out, ok
    end
    local out, ok = sh("cp -R " .. q(root) .. "/bin " .. q(root) .. "/csrc " .. q(root) .. "/docs " .. q(root)
                       .. "/lua " .. q(root) .. "/rockspec .", config_line,
                       "luarocks --lua-version=5.4 --tree=t54 make rockspec/redislock-scm-1.rockspec >/dev/null",
                       "LUAROCKS_CONFIG=luajit.lua luarocks --lua-version=5.1 --tree=tjit make "
                         .. "rockspec/redislock-scm-1.rockspec >/dev/null")
    assert.is_true(ok, out)
    local v = require("redislock")._VERSION
    -- Each tree's command runs under its own Lua (LuaJIT's used to name lua5.1).
    local env = "env -u LUA_PATH -u LUA_CPATH -u LUA_PATH_5_4 -u LUA_CPATH_5_4 LD_PRELOAD= "
    for _, tree in ipairs({ "t54", "tjit" }) do
      out, ok = sh(env .. "sh -c " .. q('eval "$(luarocks --lua-version=' .. (tree == "t54" and "5.4" or "5.1")
                                         .. " --tree=" .. tree .. ' path)" && ' .. tree .. "/bin/redislock --version"))
      assert.is_true(ok, out)
      assert.are.equal("redislock " .. v .. "\n", out)
    end
    -- Both Lua paths set as the README says: each interpreter finds its own build.
    local paths = table.concat({
      'export LUA_PATH_5_4="$(luarocks --lua-version=5.4 --tree=t54 path --lr-path);;"',
      'export LUA_CPATH_5_4="$(luarocks --lua-version=5.4 --tree=t54 path --lr-cpath);;"',
      'eval "$(luarocks --lua-version=5.1 --tree=tjit path)"' }, " && ")
    local which = "local p = package.searchpath('redislock.core', package.cpath) "
                  .. "print(p:match('/(t54)/') or p:match('/(tjit)/') or p)"
    out, ok = sh(env .. "sh -c " .. q(paths .. " && lua5.4 -e " .. q("require 'redislock' " .. which)
                                       .. " && luajit -e " .. q("require 'redislock' " .. which)))
    assert.is_true(ok, out)
    assert.are.equal("t54\ntjit\n", out)
    -- Lua 5.4's paths in LUA_CPATH, read by LuaJIT too: a message, not an undefined symbol alone.
    out, ok = sh(env .. "sh -c " .. q('eval "$(luarocks --lua-version=5.4 --tree=t54 path)" && luajit -e '
                                       .. q("require 'redislock'")))
    assert.is_false(ok, out)
    assert.is_truthy(out:find("redislock: the C core [^\n]*/t54/[^\n]*core.so was built for another Lua than this one "
                              .. "%(LuaJIT [^:]+: no lua_"), out)
    os.execute("rm -rf " .. q(dir))
  end)
end)
