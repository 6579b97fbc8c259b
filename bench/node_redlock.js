// SPDX-License-Identifier: MIT
// The node-redlock side of `make bench` (a benchmark, not a test): node-redlock
// v5 over ioredis, as its README shows, on the same five servers as
// bench/redlock.lua. Run from a temporary folder where `npm install
// redlock@5 ioredis@5` put its modules (NODE_PATH), never the checkout.
//
//   node node_redlock.js PORTS N    prints cycles_per_s=<rate> for N acquire+release cycles
//                                   (PORTS: the servers' ports, comma-separated)
"use strict";
const Redis = require("ioredis");
const Redlock = require("redlock").default;

async function main() {
  const ports = process.argv[2].split(",").map(Number);
  const n = Number(process.argv[3]);
  const clients = ports.map((port) => new Redis({ host: "127.0.0.1", port }));
  const redlock = new Redlock(clients, { retryCount: 0 });
  const warm = await redlock.acquire(["bench:node-redlock"], 10000);
  await warm.release();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) {
    const lock = await redlock.acquire(["bench:node-redlock"], 10000);
    await lock.release();
  }
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(`cycles_per_s=${n / seconds}`);
  clients.forEach((c) => c.disconnect());
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
