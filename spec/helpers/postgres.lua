-- SPDX-License-Identifier: MIT
-- spec/helpers.lua's private PostgreSQL server (helpers.start_postgres),
-- for the guarded writes' SQL specs.

return function(helpers)
  local run = helpers.run
  local sh_quote = helpers.sh_quote

  local Postgres = {}
  Postgres.__index = Postgres

  --- Starts a private PostgreSQL 15 server on a free loopback port, in a
  -- folder of its own (initdb, trust authentication), run as the user
  -- "nobody" (PostgreSQL refuses root); its socket is in the folder too.
  -- Fields: port, user ("nobody"), db ("postgres"), dir. pg:psql(sql) runs
  -- one statement and returns its output; pg:stop(). Raises when it cannot
  -- start. Needs Debian's postgresql package.
  function helpers.start_postgres()
    local bin = "/usr/lib/postgresql/15/bin/"
    local dir = (run("mktemp -d"):gsub("%s+$", ""))
    local pg = setmetatable({ port = helpers.free_port(), user = "nobody", db = "postgres", dir = dir }, Postgres)
    local as = "runuser -u nobody -- "
    local out, ok = run(table.concat({
      "chmod 755 " .. sh_quote(dir), "chown nobody " .. sh_quote(dir),
      as .. bin .. "initdb -A trust -U nobody -D " .. sh_quote(dir .. "/data") .. " >/dev/null",
      as .. bin .. "pg_ctl -w -t 30 -D " .. sh_quote(dir .. "/data") .. " -l " .. sh_quote(dir .. "/log")
        .. " -o " .. sh_quote("-p " .. pg.port .. " -k " .. dir .. " -c listen_addresses=127.0.0.1") .. " start"
        .. " >/dev/null",
    }, " && ") .. " 2>&1")
    if not ok then
      os.execute("rm -rf " .. sh_quote(dir))
      error("cannot start PostgreSQL: " .. out)
    end
    return pg
  end

  function Postgres:psql(sql)
    local out, ok = run("runuser -u nobody -- psql -X -q -t -A -h 127.0.0.1 -p " .. self.port
                        .. " -U nobody -d postgres -c " .. sh_quote(sql) .. " 2>&1")
    assert(ok, out)
    return (out:gsub("\n$", ""))
  end

  function Postgres:stop()
    run("runuser -u nobody -- /usr/lib/postgresql/15/bin/pg_ctl -m immediate -D " .. sh_quote(self.dir .. "/data")
        .. " stop >/dev/null 2>&1")
    os.execute("rm -rf " .. sh_quote(self.dir))
  end
end
