-- SPDX-License-Identifier: MIT
-- What the failover-fence tests of spec/30 and spec/45 (plain Lua and
-- OpenResty) share: cutting a replica off its master, waiting for one to
-- catch up, taking every primitive's fence, and comparing fences.
local helpers = require("spec.helpers")

local failover = {}

--- Sends signal sig ("STOP", "CONT", ...) to a server, by its PID.
function failover.signal(s, sig)
  assert(os.execute("kill -" .. sig .. " " .. s.pid))
end

--- Waits until replica has applied everything master wrote so far.
function failover.synced(master, replica)
  local want = tonumber(master:cli("INFO", "replication"):match("master_repl_offset:(%d+)"))
  assert(helpers.eventually(15, function()
    local info = replica:cli("INFO", "replication")
    local got = tonumber(info:match("slave_repl_offset:(%d+)") or "-1")
    return info:find("master_link_status:up", 1, true) and got >= want
  end), "the replica never caught up")
end

--- Cuts replica off master: it applies none of master's writes from now on
-- (SIGSTOP alone is not enough: what the master already sent would wait in
-- its socket and be applied after SIGCONT).
function failover.cut_off(master, replica)
  failover.signal(replica, "STOP")
  master:cli("CLIENT", "KILL", "TYPE", "replica")
end

--- Checks (busted's assert) that every fence in new is above the same
-- primitive's in old (tables of name -> fence).
function failover.above(new, old, what)
  for name, fence in pairs(old) do
    assert(new[name] and new[name] > fence,
           string.format("%s: %s fence %s is not above %d", what, name, tostring(new[name]), fence))
  end
end

--- Notes fence under name in top (name -> fence) if it is above what is there.
function failover.note(top, name, fence)
  assert(type(fence) == "number", name .. ": no fence")
  if not top[name] or fence > top[name] then top[name] = fence end
end

--- Takes and releases, rounds times over client, a lock on keys.lock, one
-- on keys.fresh (if given), a permit of the semaphore "<lock>:pool", the
-- writer of the read-write lock "<lock>:doc", a lock on "<lock>:a" and
-- "<lock>:b" and (if keys.election names one) an election's leadership
-- (campaign, resign). Returns the highest fence of each: { lock, fresh,
-- permit, write, multi_a, multi_b, term }.
function failover.take_all(client, rounds, keys)
  local top, opts, note, key = {}, { wait = 6 }, failover.note, keys.lock
  for _ = 1, rounds do
    local l = assert(client:acquire(key, 5, opts))
    note(top, "lock", l.fence)
    assert(l:release())
    if keys.fresh then
      l = assert(client:acquire(keys.fresh, 5, opts))
      note(top, "fresh", l.fence)
      assert(l:release())
    end
    l = assert(client:semaphore(key .. ":pool", 2):acquire(5, opts))
    note(top, "permit", l.fence)
    assert(l:release())
    l = assert(client:rwlock(key .. ":doc"):write(5, opts))
    note(top, "write", l.fence)
    assert(l:release())
    l = assert(client:acquire({ key .. ":a", key .. ":b" }, 5, opts))
    note(top, "multi_a", l.fence[1])
    note(top, "multi_b", l.fence[2])
    assert(l:release())
    if keys.election then
      l = assert(client:election(keys.election):campaign("me", 5, opts))
      note(top, "term", l.term)
      assert(l:resign())
    end
  end
  return top
end

--- take_all's first round, tried again for up to 15 s while a failover
-- settles or an address moves (a connection to the server gone fails the
-- first call).
function failover.first_round(client, keys)
  local first, err
  assert(helpers.eventually(15, function()
    local ok, top = pcall(failover.take_all, client, 1, keys)
    first, err = ok and top, top
    return first
  end), "no locks within 15 s: " .. tostring(err))
  return first
end

--- The fences in a line "name=N name=N ..." (spec/support/ngx_app.lua's /fences).
function failover.parse(line)
  local t = {}
  for name, n in line:gmatch("(%S+)=(%d+)") do t[name] = tonumber(n) end
  return t
end

return failover
