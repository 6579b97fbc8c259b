-- SPDX-License-Identifier: MIT
-- A lock holder paused past its TTL, for the guarded-write specs (spec/33,
-- spec/34): a real process (spec/workers/guarded_writer.lua) that is
-- stopped with SIGSTOP once it holds its lock, stays stopped past the TTL
-- while its successor writes, then resumes and writes too.
local core = require("redislock.core")
local helpers = require("spec.helpers")

local WORKER = helpers.spec_dir .. "workers/guarded_writer.lua"

--- paused.holder(where, key, form, resource_where, rkey, successor) -> the
-- worker's output. The worker takes key on where (spec/workers/connect.lua)
-- for 0.5 s, is stopped once it holds it, and stays stopped for 0.7 s while
-- successor() runs; then it resumes and writes "old" to rkey through the
-- guard of form (the worker's usage). Raises what successor raised.
return {
  holder = function(where, key, form, resource_where, rkey, successor)
    local dir = (helpers.run("mktemp -d"):gsub("%s+$", ""))
    local worker = helpers.spawn(WORKER, where, key, "0.5", form, resource_where or "", rkey, dir)
    local pid
    assert(helpers.eventually(10, function()
      local f = io.open(dir .. "/pid")
      pid = f and f:read("a")
      if f then f:close() end
      return pid
    end), "the worker never held the lock")
    assert(os.execute("kill -STOP " .. pid))
    local ok, err = pcall(function()
      core.sleep(0.7) -- past its TTL
      successor()
    end)
    assert(os.execute("kill -CONT " .. pid))
    assert(io.open(dir .. "/go", "w")):close()
    local out = worker.wait()
    os.execute("rm -rf " .. helpers.sh_quote(dir))
    assert(ok, err)
    return out
  end,
}
