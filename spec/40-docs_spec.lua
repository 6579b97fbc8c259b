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

  it("keeps the front page short: about 300 lines at most", function()
    local n = 0
    for _ in io.lines(helpers.spec_dir .. "../README.md") do n = n + 1 end
    assert.is_true(n <= 300, "README.md has " .. n .. " lines")
  end)
end)
