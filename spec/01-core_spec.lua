-- SPDX-License-Identifier: MIT
-- The C core on its own: tokens, time conversion, key checks, script names.
local core = require("redislock.core")
local helpers = require("spec.helpers")

describe("redislock.core", function()
  it("makes 128-bit hex tokens that do not repeat", function()
    local seen = {}
    for _ = 1, 2000 do
      local t = core.token()
      assert.is_truthy(t:match("^%x+$"))
      assert.are.equal(32, #t)
      assert.is_nil(seen[t])
      seen[t] = true
    end
  end)

  it("uses every hex digit in every position of its tokens", function()
    -- A token built from time or a pid would keep some positions fixed.
    local digits = {}
    for i = 1, 32 do digits[i] = {} end
    for _ = 1, 1000 do
      local t = core.token()
      for i = 1, 32 do digits[i][t:sub(i, i)] = true end
    end
    for i = 1, 32 do
      local n = 0
      for _ in pairs(digits[i]) do n = n + 1 end
      assert.are.equal(16, n, "position " .. i)
    end
  end)

  it("converts seconds to whole milliseconds, rounding to nearest", function()
    assert.are.equal(1000, core.ms(1))
    assert.are.equal(1500, core.ms(1.5))
    assert.are.equal(2, core.ms(0.0015))
    assert.are.equal(1, core.ms(0.001))
    assert.are.equal(86400000, core.ms(86400))
  end)

  it("refuses times that are not positive finite numbers of at least 1 ms", function()
    local cases = {
      { 0, "must be > 0" }, { -1, "must be > 0" }, { 0 / 0, "NaN" },
      { math.huge, "finite" }, { -math.huge, "finite" }, { 0.0004, "at least 0.001" },
      { 1e13, "at most 9007199254740.992 (2^53 ms" }, { "5", "number expected, got string" },
      { nil, "number expected, got nil" },
    }
    for _, c in ipairs(cases) do
      local ms, why = core.ms(c[1])
      assert.is_nil(ms, tostring(c[1]))
      assert.is_truthy(why:find(c[2], 1, true), why)
    end
  end)

  it("refuses a prefix with braces, which would take over the hash tag", function()
    assert.is_nil(core.prefix_problem("lock:"))
    assert.is_nil(core.prefix_problem(""))
    assert.are.equal("must not contain '{' or '}'", core.prefix_problem("x{}"))
    assert.are.equal("must not contain '{' or '}'", core.prefix_problem("app}"))
  end)

  it("accepts any non-empty key that keeps the hash tag whole", function()
    assert.is_nil(core.key_problem("orders:42"))
    assert.is_nil(core.key_problem("a{b}c"))
    assert.is_nil(core.key_problem("with\0nul"))
    assert.are.equal("key must not be empty", core.key_problem(""))
    assert.are.equal("key must not start with '}'", core.key_problem("}x"))
  end)

  it("carries one version string", function()
    assert.is_truthy(core._VERSION:match("^%d+%.%d+%.%d+"))
    assert.are.equal(core._VERSION, require("redislock")._VERSION)
  end)

  it("keeps the clock monotonic and sleeps", function()
    local t0 = core.now()
    core.sleep(0.02)
    local dt = core.now() - t0
    assert.is_true(dt >= 0.02)
  end)

  it("tells Lua the lease machine's renewal step, and refuses a TTL below 1 ms", function()
    -- redislock run --min-hold paces its last extends by it (redislock/lease.lua)
    assert.equal(1000, core.renewal_step(3000))
    assert.equal(1, core.renewal_step(2))
    assert.error_matches(function() core.renewal_step(0) end, "a TTL of at least 1 ms")
    assert.error_matches(function() core.renewal_step("x") end, "number expected")
  end)

  it("passes the protocol core's own C unit test, without Lua or a server", function()
    -- build/proto_test (make test builds it, under ASan and UBSan): the
    -- commands, replies, slots, redirects and checks of rl_proto.c,
    -- rl_script.c, rl_scripts.c, rl_slot.c and rl_sys.c, linked without any Lua header.
    local bin = helpers.root() .. "/build/proto_test"
    assert.is_true(helpers.sh_ok("test -x " .. helpers.sh_quote(bin)), "build/proto_test missing: run make test")
    local out, ok = helpers.run(helpers.sh_quote(bin) .. " 2>&1")
    assert.is_true(ok, out)
    assert.matches("proto_test: %d%d%d+ checks, 0 failed", out)
  end)

  it("tells an error's class to Lua, and the loops retry by the class alone", function()
    -- (Each message's class: proto_test's test_errors.)
    local errors = require("redislock.errors")
    assert.are.equal("stale", core.error_class("redis: READONLY You can't write against a read only replica."))
    assert.are.equal("closed", core.error_class("connection: lost 127.0.0.1:6379 (Connection reset by peer)"))
    assert.is_nil(core.error_class(nil))
    assert.is_nil(core.error_class({}))
    assert.is_nil(core.error_class("not one of ours"))
    assert.are.same({ LOADING = "transient", BUSY = "transient", READONLY = "stale", MASTERDOWN = "stale",
                      UNBLOCKED = "stale", TRYAGAIN = "tryagain", CLUSTERDOWN = "clusterdown", MOVED = "redirect",
                      ASK = "redirect", NOPERM = "refused", NOSCRIPT = "refused", OOM = "refused" }, core.error_codes)
    -- What a wait retries: the passing states and every connection failure.
    assert.are.same({ LOADING = true, BUSY = true, READONLY = true, MASTERDOWN = true, UNBLOCKED = true,
                      TRYAGAIN = true, CLUSTERDOWN = true }, require("redislock").TRANSIENT)
    assert.is_true(errors.retry("connection: cannot connect to h:1 (Connection refused)", "wait"))
    assert.is_false(errors.retry("redis: NOPERM no", "wait"))
    assert.is_false(errors.retry(nil, "wait"))
    -- A release is resent only when the command did not run; one that went
    -- out unanswered may have run.
    assert.is_true(errors.retry("redis: LOADING Redis is loading", "again"))
    assert.is_false(errors.retry("connection: h:1 did not answer within 1 s (timeout)", "again"))
    assert.is_true(errors.unanswered("connection: h:1 did not answer within 1 s (timeout)"))
    assert.is_false(errors.unanswered("connection: cannot connect to h:1 (Connection refused)"))
    assert.is_true(errors.connection("connection: cannot connect to h:1 (Connection refused)"))
    assert.is_false(errors.connection("redis: ERR no"))
    -- Sentinel goes to the master it resolves again, at once when nothing was
    -- sent (a new connection found the node demoted, or the server closed an
    -- idle one before it read the bytes).
    local not_master = "redis: READONLY h:1 says ROLE slave on a new connection, not master (nothing was sent)"
    local unsent = "connection: h:1 closed the connection (nothing was sent)"
    assert.are.equal("demoted", core.error_class(not_master))
    assert.are.equal("unsent", core.error_class(unsent))
    assert.is_true(errors.retry(not_master, "resolve") and errors.retry(not_master, "resend"))
    assert.is_true(errors.retry(unsent, "resolve") and errors.retry(unsent, "resend"))
    assert.is_true(errors.connection(unsent) and not errors.unanswered(unsent))
    assert.is_false(errors.retry("redis: READONLY You can't write", "resend"))
    -- Cluster retries TRYAGAIN and CLUSTERDOWN on the spot, and looks again after CLUSTERDOWN.
    assert.is_true(errors.retry("redis: TRYAGAIN x", "here") and not errors.retry("redis: TRYAGAIN x", "resolve"))
    assert.is_true(errors.retry("redis: CLUSTERDOWN x", "here") and errors.retry("redis: CLUSTERDOWN x", "resolve"))
  end)

  describe("scripts", function()
    local srv
    lazy_setup(function() srv = helpers.start_redis() end)
    lazy_teardown(function() srv:stop() end)

    it("are named by the SHA-1 Redis computes for them", function()
      local raw = srv:raw()
      for name, s in pairs(core.scripts) do
        assert.are.equal(s.sha, raw:command("SCRIPT", "LOAD", s.text), name)
      end
      raw:close()
    end)

    it("wrap a user's script under a guard, with or without its last newline", function()
      local raw = srv:raw()
      for _, owned in ipairs({ false, true }) do
        for _, user in ipairs({ "return ARGV[1]", "return ARGV[1]\n" }) do
          local text, sha = core.guard_script(owned, user)
          assert.are.equal(sha, raw:command("SCRIPT", "LOAD", text))
        end
      end
      raw:close()
    end)

  end)
end)
