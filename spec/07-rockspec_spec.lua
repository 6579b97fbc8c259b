-- SPDX-License-Identifier: MIT
-- `luarocks make` builds and installs the module offline, linking the system
-- hiredis, for the interpreter running the suite (Lua 5.4, or LuaJIT as 5.1).
local helpers = require "spec.helpers"

describe("the rockspec", function()
  it("installs with luarocks make into a fresh tree, and the module loads from it", function()
    local root = helpers.spec_dir .. ".."
    local dir = (helpers.run("mktemp -d"):gsub("%s+$", ""))
    local q = helpers.sh_quote
    local version = jit and "5.1" or _VERSION:match("%d+%.%d+")
    local incdir = jit and " LUA_INCDIR=/usr/include/luajit-2.1" or ""
    -- Build in a copy: luarocks make compiles inside the source tree. (Under
    -- `make asan`, helpers.run keeps the sanitizer runtime away from luarocks.)
    local out, ok = helpers.run(table.concat({
      "cd " .. q(root),
      "cp -R bin csrc lua rockspec " .. q(dir),
      "cd " .. q(dir),
      "luarocks --lua-version=" .. version .. " --tree=" .. q(dir .. "/tree")
        .. " make rockspec/redislock-scm-1.rockspec" .. incdir,
    }, " && "))
    assert.is_true(ok, out)
    -- Every Lua module of the checkout (lua/redislock.lua, lua/redislock/*.lua)
    -- must come from the tree.
    local files = helpers.run("cd " .. q(root .. "/lua") .. " && find . -name '*.lua' | sort")
    local modules = {}
    for file in files:gmatch("%./(%S+)%.lua") do modules[#modules + 1] = string.format("%q", file:gsub("/", ".")) end
    assert.is_true(#modules >= 8, files)
    local check = [[
      local redislock = require "redislock"
      local core = require "redislock.core"
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
end)
