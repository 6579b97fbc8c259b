-- SPDX-License-Identifier: MIT
-- Benchmark (not a test): what TLS costs. One redis-server of its own serves
-- a plaintext port and a TLS port (certificates made by openssl in a
-- temporary folder; the client verifies the chain and the name), pinned to
-- core BENCH_SERVER_CPU (0). In the same slices (benchlib's):
--  * uncontended acquire+release cycles over TLS, as a ratio to the same
--    cycles over plaintext (the steady state: one handshake per connection,
--    paid once; target >= 0.85);
--  * new connections: a fresh client takes and releases one lock, then
--    closes (handshake included), TLS as a ratio to plaintext (no target).
-- usage (from bench/run.sh, pinned by taskset): tls.lua <placement name>
local redislock = require("redislock")
local B = require("benchlib")

local N, SLICES = B.knob("BENCH_CYCLES", 4000), B.knob("BENCH_SLICES", 15)
local CONNECTS = math.max(50, math.floor(N / 20))
local id, where = B.id, B.where

local dir = (B.run("mktemp -d"):gsub("%s+$", ""))
local function in_dir(cmd)
  local out, ok = B.run("cd " .. B.sh_quote(dir) .. " && " .. cmd .. " 2>&1")
  assert(ok, cmd .. ": " .. out)
end
local newkey = "-nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1"
in_dir("openssl req -x509 " .. newkey .. " -keyout ca.key -out ca.crt -days 1 -subj /CN=bench-ca")
in_dir("openssl req -new " .. newkey .. " -keyout server.key -out server.csr -subj /CN=localhost")
in_dir("printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext")
in_dir("openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 1"
       .. " -extfile san.ext")

local plain_port, tls_port = B.free_port(), B.free_port()
local pids = B.start_servers(dir, { { port = plain_port, args = "--tls-port " .. tls_port
  .. " --tls-cert-file server.crt --tls-key-file server.key --tls-ca-cert-file ca.crt --tls-auth-clients no" } }, true)

local plain_opts = { port = plain_port }
local tls_opts = { host = "localhost", port = tls_port, tls = { ca = dir .. "/ca.crt" } }

local function connects_on(opts)
  return B.rate(CONNECTS, function()
    local client = redislock.new(opts)
    assert(assert(client:acquire("bench", 10)):release())
    client:close()
  end)
end

local ok, err = pcall(function()
  local rates = B.slices({
    { "plain", B.cycles_on(plain_opts, N) },
    { "tls", B.cycles_on(tls_opts, N) },
    { "plain_connect", connects_on(plain_opts) },
    { "tls_connect", connects_on(tls_opts) },
  }, SLICES)
  local median = {}
  for name, list in pairs(rates) do median[name] = math.floor(B.percentile(list, 50) + 0.5) end
  local function note(a, b, n)
    local _, lo, hi = B.median_ratio(rates[a], rates[b])
    return string.format("median of %d slices of %d; slice ratios %.2f-%.2f", SLICES, n, lo, hi)
  end
  B.emit({ name = "cycle.plain/" .. id, value = median.plain, unit = "cycles/s",
           note = string.format("median of %d slices of %d cycles", SLICES, N),
           label = where .. ": acquire+release over plaintext (TLS bench's server)" })
  B.emit({ name = "cycle.tls/" .. id, value = median.tls, unit = "cycles/s", baseline = "cycle.plain/" .. id,
           baseline_value = median.plain, ratio = (B.median_ratio(rates.tls, rates.plain)), target = { ">=", 0.85 },
           note = note("tls", "plain", N), label = where .. ": acquire+release over TLS (verified), vs plaintext" })
  B.emit({ name = "connect.plain/" .. id, value = median.plain_connect, unit = "clients/s",
           note = string.format("median of %d slices of %d", SLICES, CONNECTS),
           label = where .. ": new client, acquire, release, close; plaintext" })
  B.emit({ name = "connect.tls/" .. id, value = median.tls_connect, unit = "clients/s",
           baseline = "connect.plain/" .. id, baseline_value = median.plain_connect,
           ratio = (B.median_ratio(rates.tls_connect, rates.plain_connect)), note = note("tls_connect", "plain_connect",
           CONNECTS), label = where .. ": new client, acquire, release, close; TLS (a handshake each)" })
end)
B.stop_servers(pids, dir)
assert(ok, err)
