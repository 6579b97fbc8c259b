-- SPDX-License-Identifier: MIT
-- A tiny HTTP/1.1 client over luasocket for the specs that drive a real nginx
-- (spec/helpers.lua start_nginx): one request per connection, `Connection:
-- close`, the response read to EOF. Works under Lua 5.4 and LuaJIT alike.
local socket = require("socket")

local http = {}

-- Valgrind or sanitizers slow everything down (as in spec/helpers.lua).
local slow = os.getenv("REDISLOCK_SLOW") ~= nil and 10 or 1
local default_timeout = 10 * slow

-- A request given as a plain path means GET.
local function normalize(req)
  if type(req) == "string" then return { method = "GET", path = req } end
  return req
end

-- The request's bytes; Host and Content-Length are ours unless given.
local function format_request(port, method, path, headers, body)
  local lines = { method .. " " .. path .. " HTTP/1.1" }
  local given = {}
  for name, value in pairs(headers or {}) do
    lines[#lines + 1] = name .. ": " .. value
    given[name:lower()] = true
  end
  if not given.host then lines[#lines + 1] = "Host: 127.0.0.1:" .. port end
  lines[#lines + 1] = "Connection: close"
  if body and not given["content-length"] then lines[#lines + 1] = "Content-Length: " .. #body end
  return table.concat(lines, "\r\n") .. "\r\n\r\n" .. (body or "")
end

-- Connects to 127.0.0.1:port and sends the request; returns the socket or
-- nil and a message naming what failed.
local function send(port, method, path, opts)
  local c, err = socket.tcp()
  if not c then return nil, "cannot make a socket: " .. err end
  c:settimeout(opts.timeout or default_timeout)
  local ok
  ok, err = c:connect("127.0.0.1", port)
  if ok then
    ok, err = c:send(format_request(port, method, path, opts.headers, opts.body))
  end
  if not ok then
    c:close()
    return nil, ("%s %s to 127.0.0.1:%d: %s"):format(method, path, port, err)
  end
  return c
end

-- Undoes chunked transfer coding; nil when the body is cut short.
local function dechunk(s)
  local parts, pos = {}, 1
  while true do
    local size_hex, data_at = s:match("^(%x+)[^\r\n]*\r\n()", pos)
    if not size_hex then return nil end
    local size = tonumber(size_hex, 16)
    if size == 0 then return table.concat(parts) end
    if #s < data_at + size - 1 then return nil end
    parts[#parts + 1] = s:sub(data_at, data_at + size - 1)
    pos = data_at + size + 2
  end
end

-- Splits a whole response into status, body and headers (lower-case names;
-- a repeated header's values joined with ", "); nil and a message if malformed.
local function parse(raw)
  local head_end = raw:find("\r\n\r\n", 1, true)
  if not head_end then return nil, "no complete response head in " .. ("%q"):format(raw:sub(1, 200)) end
  local head, body = raw:sub(1, head_end - 1), raw:sub(head_end + 4)
  local status = tonumber(head:match("^HTTP/%d%.%d (%d%d%d)"))
  if not status then return nil, "bad status line in " .. ("%q"):format(head:sub(1, 200)) end
  local headers = {}
  for name, value in head:gmatch("\r\n([^:\r\n]+):[ \t]*([^\r\n]*)") do
    name = name:lower()
    headers[name] = headers[name] and headers[name] .. ", " .. value or value
  end
  if (headers["transfer-encoding"] or ""):lower():find("chunked", 1, true) then
    body = dechunk(body)
    if not body then return nil, "chunked body cut short" end
  end
  return status, body, headers
end

-- Reads the response to EOF and closes the socket; returns status, body,
-- headers, or nil and a message. start is what earlier non-blocking reads got.
local function receive(c, start)
  local data, err, partial = c:receive("*a")
  c:close()
  -- luasocket's "*a" says "closed" when the close came with no new bytes:
  -- the earlier reads (start) had the whole response.
  if not data and err == "closed" and start and start ~= "" then data = partial or "" end
  if not data then
    return nil, ("reading the response: %s after %d bytes"):format(err, #(start or "") + #(partial or ""))
  end
  return parse((start or "") .. data)
end

--- Sends one request to 127.0.0.1:port and waits for the response.
-- opts.headers (name -> value), opts.body, opts.timeout (seconds, default 10).
-- Returns status (number), body (string), headers (lower-case names); raises
-- when the connection fails or the response is not HTTP.
function http.request(port, method, path, opts)
  opts = opts or {}
  local c, err = send(port, method, path, opts)
  if not c then error("http.request: " .. err, 2) end
  local status, body, headers = receive(c)
  if not status then error(("http.request: %s %s: %s"):format(method, path, body), 2) end
  return status, body, headers
end

--- Sends every request before reading any response, one connection each, so
-- that all are in flight at once. requests: a list of { method=, path=,
-- headers=, body= } or paths (GET); opts.timeout as for request. Returns a list
-- of { status=, body=, headers= } in the same order; raises naming the first
-- request that failed (closing the others).
function http.parallel(port, requests, opts)
  opts = opts or {}
  local conns = {}
  local function close_all()
    for _, c in pairs(conns) do c:close() end
  end
  for i, req in ipairs(requests) do
    req = normalize(req)
    local c, err = send(port, req.method or "GET", req.path,
                        { headers = req.headers, body = req.body, timeout = opts.timeout })
    if not c then
      close_all()
      error(("http.parallel: request %d of %d: %s"):format(i, #requests, err), 2)
    end
    conns[i] = c
  end
  local results = {}
  for i, req in ipairs(requests) do
    req = normalize(req)
    local status, body, headers = receive(conns[i])
    conns[i] = nil
    if not status then
      close_all()
      error(("http.parallel: request %d of %d (%s %s): %s"):format(
        i, #requests, req.method or "GET", req.path, body), 2)
    end
    results[i] = { status = status, body = body, headers = headers }
  end
  return results
end

local Pending = {}
Pending.__index = Pending

--- Sends one request and returns at once with a handle: :ready() says whether
-- any of the response has arrived (never blocks), :finish() waits for it and
-- returns status, body, headers like http.request. Arguments as for request.
function http.start(port, method, path, opts)
  opts = opts or {}
  local c, err = send(port, method, path, opts)
  if not c then error("http.start: " .. err, 2) end
  return setmetatable({ sock = c, got = {}, closed = false, what = "http.start: " .. method .. " " .. path,
                        timeout = opts.timeout or default_timeout, err = nil }, Pending)
end

--- True once response bytes (or the server's close) have arrived. Reads what
-- is there without waiting and keeps it for :finish() (no socket.select, so no
-- FD_SETSIZE limit).
function Pending:ready()
  if self.closed then return true end
  self.sock:settimeout(0)
  local data, err, partial = self.sock:receive("*a")
  self.sock:settimeout(self.timeout)
  local got = data or partial
  if got ~= "" then self.got[#self.got + 1] = got end
  -- "*a" reads to EOF, so data means the server closed; an error other
  -- than timeout (a reset) ends the response too, and :finish() reports it.
  if data or err ~= "timeout" then self.closed, self.err = true, not data and err or nil end
  return #self.got > 0 or self.closed
end

--- Waits for the whole response; returns status, body, headers. Raises as
-- http.request does; call it once.
function Pending:finish()
  local status, body, headers
  if self.closed then
    self.sock:close()
    if self.err then
      status, body = nil, "reading the response: " .. self.err
    else
      status, body, headers = parse(table.concat(self.got))
    end
  else
    status, body, headers = receive(self.sock, table.concat(self.got))
  end
  if not status then error(self.what .. ": " .. body, 2) end
  return status, body, headers
end

return http
