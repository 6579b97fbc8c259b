-- SPDX-License-Identifier: MIT
-- The documentation: the API reference builds from the code's doc comments
-- without a warning (make docs, LDoc), and every link of the front page,
-- the pages under docs/ and the OpenResty example's README resolves, to a
-- file and to a heading (tools/check_links.lua).
local helpers = require "spec.helpers"

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
    for status in usage:match("exit status:(.*)$"):gmatch("%f[%d](%d+)%f[%D]") do
      assert.is_truthy(roff:find("%f[%d]" .. status .. "%f[%D]"), "exit status " .. status .. " is not in the manual")
    end
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
