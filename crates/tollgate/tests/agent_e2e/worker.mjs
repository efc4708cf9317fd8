// A worker of the agent's end-to-end test: saturates buckets through an agent.
//
// Runs --concurrency loops for --seconds, spread evenly over --buckets, each
// acquiring 1 to 5 tokens at a time (waiting up to a second), with the
// package's own retries across agent restarts, and prints what it was
// given, per bucket, as one JSON object. The package is loaded from the
// directory in TOLLGATE_NODE_CLIENT (clients/node, built).
import { parseArgs } from "node:util";
import { pathToFileURL } from "node:url";
import path from "node:path";

const { values } = parseArgs({
  options: {
    socket: { type: "string" },
    tenant: { type: "string" },
    buckets: { type: "string" },
    seconds: { type: "string" },
    concurrency: { type: "string", default: "4" },
    seed: { type: "string", default: "0" },
  },
});
const pkg = await import(pathToFileURL(path.join(process.env.TOLLGATE_NODE_CLIENT, "dist", "index.js")).href);
const { Limiter, NotAdmittedError } = pkg;

const buckets = values.buckets.split(",");
const admitted = Object.fromEntries(buckets.map((b) => [b, 0]));
let calls = 0;
let notAdmitted = 0;
const errors = [];
const limiter = new Limiter({ tenant: values.tenant, socket: values.socket, timeoutMs: 30000 });
const end = Date.now() + Number(values.seconds) * 1000;

// A small seeded generator (mulberry32): runs differ only by their seed.
function random(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

async function work(task) {
  const next = random(Number(values.seed) * 1000 + task);
  const bucket = buckets[task % buckets.length];
  while (Date.now() < end) {
    const tokens = 1 + Math.floor(next() * 5);
    calls += 1;
    try {
      await limiter.acquire(bucket, tokens, { maxWaitMs: 1000 });
      admitted[bucket] += tokens;
    } catch (error) {
      if (error instanceof NotAdmittedError) {
        notAdmitted += 1;
      } else {
        errors.push(String(error));
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    }
  }
}

await Promise.all(Array.from({ length: Number(values.concurrency) }, (_, task) => work(task)));
limiter.close();
console.log(
  JSON.stringify({ admitted, calls, not_admitted: notAdmitted, errors: errors.slice(0, 5), error_count: errors.length }),
);
