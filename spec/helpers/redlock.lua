-- SPDX-License-Identifier: MIT
-- spec/helpers.lua's independent servers for Redlock (helpers.start_redlock).

return function(helpers)
  --- Starts n (5) independent redis-servers for Redlock, each persisting every
  -- write (appendonly, appendfsync always: a slot's fence record, which a
  -- Redlock's second phase may raise above the server's clock, must survive
  -- a restart). Returns the Servers, and their URLs as one comma-separated
  -- text (for spec/workers/connect.lua's redlock:...). Raises when one
  -- cannot start (stopping those that did).
  function helpers.start_redlock(n)
    local servers, urls = {}, {}
    for i = 1, n or 5 do
      local ok, srv = pcall(helpers.start_redis, { "--appendonly", "yes", "--appendfsync", "always" })
      if not ok then
        for _, done in ipairs(servers) do done:stop() end
        error(srv)
      end
      servers[i], urls[i] = srv, srv.url
    end
    return servers, table.concat(urls, ",")
  end
end
