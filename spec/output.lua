-- SPDX-License-Identifier: MIT
-- busted output handler: the usual terminal output, plus one line per run
-- ("<interpreter> passed failed skipped") appended to $REDISLOCK_COUNTS, which
-- spec/run.sh sums into the final "N passed, N failed" line.
return function(options)
  local busted = require("busted")
  local handler = require("busted.outputHandlers.plainTerminal")(options)

  busted.subscribe({ "suite", "end" }, function()
    local path = os.getenv("REDISLOCK_COUNTS")
    if path then
      local f = assert(io.open(path, "a"))
      f:write(string.format("%s %d %d %d\n", os.getenv("REDISLOCK_LUA") or "lua",
        handler.successesCount, handler.failuresCount + handler.errorsCount,
        handler.pendingsCount))
      f:close()
    end
    return nil, true
  end, { priority = 2 })

  return handler
end
