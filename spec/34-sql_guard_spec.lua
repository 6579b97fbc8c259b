-- SPDX-License-Identifier: MIT
-- The fence guard for a SQL row (redislock/sql.lua) against a real
-- PostgreSQL 15 (started in a folder of its own, as the user nobody), over
-- LuaSQL (Debian's lua-sql-postgres, for Lua 5.4 and LuaJIT): a holder
-- stopped past its TTL (a real process, SIGSTOP) whose UPDATE comes after
-- its successor's changes no row; an upsert with an older fence than the
-- row's is refused, also once nobody holds the lock; the statements.
local core = require("redislock.core")
local helpers = require("spec.helpers")
local sql = require("redislock.sql")

local paused_holder = require("spec.support.paused").holder

-- PostgreSQL refuses to run as root: it is started as nobody (runuser),
-- which needs root; elsewhere this spec fails loudly.
describe("a SQL row guarded by the fence", function()
  local srv, client, pg, env, conn

  -- Runs a statement built by sql (text, params) through LuaSQL; the rows it changed.
  local function exec(text, params)
    return assert(conn:execute(sql.inline(text, params, function(s) return conn:escape(s) end)))
  end

  local function body(id)
    return pg:psql("SELECT body || ' ' || fence FROM reports WHERE id = " .. id)
  end

  lazy_setup(function()
    srv = helpers.start_redis()
    client = srv:client()
    pg = helpers.start_postgres()
    pg:psql("CREATE TABLE reports (id int PRIMARY KEY, body text NOT NULL, fence bigint NOT NULL DEFAULT 0)")
    env = require("luasql.postgres").postgres()
    conn = assert(env:connect("postgres", "nobody", nil, "127.0.0.1", pg.port))
  end)
  lazy_teardown(function()
    if conn then conn:close() end
    if env then env:close() end
    if pg then pg:stop() end
    if client then client:close() end
    if srv then srv:stop() end
  end)

  it("refuses a paused holder's UPDATE after its successor's", function()
    pg:psql("INSERT INTO reports (id, body) VALUES (1, 'first')")
    local out = paused_holder(tostring(srv.port), "g:sql", "sql", tostring(pg.port), "1", function()
      local lock = assert(client:acquire("g:sql", 5))
      assert.are.equal(1, math.floor(exec(sql.update(lock, "reports", { body = "new" }, { id = 1 }))))
      assert(lock:release())
    end)
    assert.matches("refused %(no row changed%)", out)
    assert.matches("^new %d+$", body(1))
  end)

  it("refuses an upsert with an older fence than the row's, also once nobody holds the lock", function()
    local old = assert(client:acquire("g:up", 0.2, { renew = false }))
    core.sleep(0.3)
    local new = assert(client:acquire("g:up", 5))
    assert.are.equal(1, math.floor(exec(sql.upsert(new, "reports", { id = 2, body = "new" }, { "id" }))))
    assert(new:release())
    assert.are.equal(0, math.floor(exec(sql.upsert(old, "reports", { id = 2, body = "old" }, { "id" }))))
    assert.are.equal(0, math.floor(exec(sql.update(old, "reports", { body = "old" }, { id = 2 }))))
    assert.are.equal("new " .. new.fence, body(2))
    -- The same holder writes again; a later one too.
    assert.are.equal(1, math.floor(exec(sql.upsert(new, "reports", { id = 2, body = "again" }, { "id" }))))
    local later = assert(client:acquire("g:up", 5))
    assert.are.equal(1, math.floor(exec(sql.update(later, "reports", { body = "later" }, { id = 2 }))))
    assert.are.equal("later " .. later.fence, body(2))
    assert(later:release())
  end)

  it("guards a write by an election's leadership, whose term is its fence", function()
    pg:psql("INSERT INTO reports (id, body) VALUES (53, 'none')")
    local lead = assert(client:election("sql:e"):campaign("me", 5))
    local text, params = sql.update(lead, "reports", { body = "leader" }, { id = 53 })
    assert.are.same({ "leader", lead.term, 53 }, params)
    assert.are.equal(1, exec(text, params))
    assert.are.equal("leader " .. string.format("%.0f", lead.term), body(53))
    assert(lead:resign())
    local next_lead = assert(client:election("sql:e"):campaign("other", 5))
    assert.is_true(next_lead.term > lead.term)
    assert.are.equal(1, exec(sql.update(next_lead, "reports", { body = "next" }, { id = 53 })))
    assert.are.equal(0, exec(sql.update(lead, "reports", { body = "deposed" }, { id = 53 })))
    assert.are.equal("next " .. string.format("%.0f", next_lead.term), body(53))
    assert(next_lead:resign())
  end)

  it("refuses what would make a bad statement: the fence column set, bad values, escape's nil, missing params",
     function()
    local hold = { fence = 7 }
    assert.has_error(function() sql.update(hold, "t", { fence = 5, a = 1 }, { id = 1 }) end,
                     "bad argument #3 to 'update' (values must not name the fence column \"fence\": the hold's "
                     .. "fence goes there)")
    assert.has_error(function() sql.update(hold, "t", { a = 1 }, { f = 1 }, { fence = "f" }) end,
                     "bad argument #4 to 'update' (where must not name the fence column \"f\": the hold's "
                     .. "fence goes there)")
    assert.has_error(function() sql.upsert(hold, "t", { k = 1, fence = 2 }, { "k" }) end)
    assert.has_error(function() sql.update(hold, "t", { a = {} }, { id = 1 }) end,
                     "bad argument #3 to 'update' (the value of column \"a\" must be a finite number, a string or "
                     .. "a boolean, got a table)")
    assert.has_error(function() sql.update(hold, "t", { a = 0 / 0 }, { id = 1 }) end)
    assert.has_error(function() sql.update(hold, "t", { a = 1 }, { id = 1 / 0 }) end)
    assert.has_error(function() sql.upsert(hold, "t", { k = 1, v = {} }, { "k" }) end)
    assert.has_error(function() sql.inline("x = $1", { "s" }, function() return nil end) end,
                     "bad argument #3 to 'inline' (escape must return a string, got nil for parameter $1)")
    assert.has_error(function() sql.inline("x = $1 AND y = $2", { 1 }, tostring) end,
                     "bad argument #2 to 'inline' (the text has $2, but params has 1 value)")
  end)

  it("writes statements for $ or ? placeholders, quoting names, and refuses bad input", function()
    local hold = { fence = 7 }
    local text, params = sql.update(hold, "my table", { ['we"ird'] = "x", a = 1 }, { id = 3 }, { fence = "f" })
    assert.are.equal('UPDATE "my table" SET "a" = $1, "we""ird" = $2, "f" = $3 WHERE "id" = $4 AND "f" <= $3', text)
    assert.are.same({ 1, "x", 7, 3 }, params)
    text, params = sql.update(hold, "t", { a = 1 }, { id = 3 }, { placeholder = "?" })
    assert.are.equal('UPDATE "t" SET "a" = ?, "fence" = ? WHERE "id" = ? AND "fence" <= ?', text)
    assert.are.same({ 1, 7, 3, 7 }, params)
    text, params = sql.upsert(hold, "t", { k = "a", v = "b" }, { "k" }, { placeholder = "?" })
    assert.are.equal('INSERT INTO "t" ("k", "v", "fence") VALUES (?, ?, ?) ON CONFLICT ("k") DO UPDATE SET '
                     .. '"v" = EXCLUDED."v", "fence" = EXCLUDED."fence" WHERE "t"."fence" <= EXCLUDED."fence"', text)
    assert.are.same({ "a", "b", 7 }, params)
    assert.has_error(function() sql.update(nil, "t", { a = 1 }, { id = 1 }) end,
                     "bad argument #1 to 'update' (a hold with a fence expected (a lock, a permit, a read or write "
                     .. "lock, a leadership))")
    assert.has_error(function() sql.update(hold, "", { a = 1 }, { id = 1 }) end)
    assert.has_error(function() sql.update(hold, "t", {}, { id = 1 }) end)
    assert.has_error(function() sql.upsert(hold, "t", { v = 1 }, { "k" }) end,
                     "bad argument #4 to 'upsert' (the row has no value for key column \"k\")")
    assert.has_error(function() sql.update(hold, "t", { a = 1 }, { id = 1 }, { placeholder = ":" }) end)
    assert.has_error(function() sql.inline("$1", { {} }, tostring) end)
    assert.has_error(function() sql.inline("$1", { 0 / 0 }, tostring) end)
    assert.has_error(function() sql.inline("a = ?", { 1 }, tostring) end,
                     "bad argument #1 to 'inline' (text with $n placeholders expected (placeholder = \"$\"))")
    assert.has_error(function() sql.update(hold, "t", { ["a$1"] = 1 }, { id = 1 }) end)
    assert.are.equal("x = 'it''s' AND y = 0.10000000000000001 AND z = TRUE",
                     sql.inline("x = $1 AND y = $2 AND z = $3", { "it's", 0.1, true }, function(s)
                       return (s:gsub("'", "''"))
                     end))
  end)
end)
