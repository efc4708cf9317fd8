// Taking, charging, reporting and giving back tokens through a real agent,
// and the server's totals afterwards: what the calls took is what the
// tenant is billed, exactly, once the agent has reported it (its graceful
// shutdown reports every bucket).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Limiter } from "@tollgate/agent";

import { Agent, Scratch, Server, started } from "./harness";

describe("buckets", () => {
  let scratch: Scratch;
  let server: Server;

  before(async () => {
    scratch = new Scratch("buckets");
    server = await Server.start(scratch);
  });
  after(async () => {
    await scratch.close();
  });

  /** A tenant of its own for each test, with a request-unit bucket and `schedule-email`. */
  async function tenant(name: string): Promise<string> {
    await server.setLimits(name, "", 100_000, 1_000, 100_000);
    await server.setLimits(name, "schedule-email", 10_000, 100, 10_000);
    return name;
  }

  async function agentFor(name: string): Promise<Agent> {
    return Agent.start(scratch, server, { name });
  }

  it("acquire, tryAcquire and charge are billed to the bucket exactly", async () => {
    const acme = await tenant("acquire-charge");
    const agent = await agentFor("acquire-charge");
    const limiter = new Limiter({ tenant: acme, socket: agent.socket });
    try {
      const admission = await limiter.acquire("schedule-email", 50);
      assert.equal(admission.fallback, false);
      assert.ok(admission.waitedMs >= 0);
      assert.equal(await limiter.tryAcquire("schedule-email", 7), true);
      await limiter.charge("schedule-email", 12.5);
      await limiter.acquire("", 3);
    } finally {
      limiter.close();
    }
    assert.equal(await agent.stop(), 0);
    const email = await server.bucket(acme, "schedule-email");
    assert.equal(email.consumption.request_unit_micros, 69_500_000);
    const units = await server.bucket(acme, "");
    assert.equal(units.consumption.request_unit_micros, 3_000_000);
  });

  it("tryAcquire takes nothing when the bucket cannot cover the tokens", async () => {
    const acme = await tenant("try-acquire");
    const agent = await agentFor("try-acquire");
    const limiter = new Limiter({ tenant: acme, socket: agent.socket });
    try {
      assert.equal(await limiter.tryAcquire("schedule-email", 1e12), false);
      assert.equal(await limiter.tryAcquire("schedule-email", 2), true);
    } finally {
      limiter.close();
    }
    assert.equal(await agent.stop(), 0);
    const email = await server.bucket(acme, "schedule-email");
    assert.equal(email.consumption.request_unit_micros, 2_000_000);
  });

  it("giveBack returns what the agent has not reported, and the server bills the rest", async () => {
    const acme = await tenant("give-back");
    const agent = await agentFor("give-back");
    const limiter = new Limiter({ tenant: acme, socket: agent.socket });
    let returned: number;
    try {
      await started(limiter, server, acme, "schedule-email");
      await limiter.acquire("schedule-email", 40);
      returned = await limiter.giveBack("schedule-email", 40);
      // Given back at once, before the agent's next report: some come back.
      assert.ok(returned > 0 && returned <= 40, `returned ${returned}`);
    } finally {
      limiter.close();
    }
    assert.equal(await agent.stop(), 0);
    const email = await server.bucket(acme, "schedule-email");
    assert.equal(email.consumption.request_unit_micros, Math.round((40 - returned) * 1e6));
  });

  it("report prices work by kind, and the server counts each kind and the request units", async () => {
    const acme = await tenant("report");
    const agent = await agentFor("report");
    const limiter = new Limiter({ tenant: acme, socket: agent.socket });
    let first: number;
    let second: number;
    try {
      first = await limiter.report({
        readRequests: 3,
        readBytes: 4096,
        writeRequests: 2,
        writeBytes: 1000,
        cpuSeconds: 0.5,
      });
      second = await limiter.report({ readRequests: 1n, egressBytes: 2048 });
      assert.ok(first > 0, `first report cost ${first}`);
      assert.ok(second > 0, `second report cost ${second}`);
    } finally {
      limiter.close();
    }
    assert.equal(await agent.stop(), 0);
    const units = await server.bucket(acme, "");
    assert.equal(units.consumption.read_requests, 4);
    assert.equal(units.consumption.read_bytes, 4096);
    assert.equal(units.consumption.write_requests, 2);
    assert.equal(units.consumption.write_bytes, 1000);
    assert.equal(units.consumption.cpu_micros, 500_000);
    assert.equal(units.consumption.egress_bytes, 2048);
    assert.ok(
      Math.abs(units.consumption.request_units - (first + second)) < 1e-6,
      `server: ${units.consumption.request_units} request units, reports: ${first} + ${second}`,
    );
  });

  it("status shows the agent's local bucket", async () => {
    const acme = await tenant("status");
    const agent = await agentFor("status");
    const limiter = new Limiter({ tenant: acme, socket: agent.socket });
    try {
      const status = await limiter.status("schedule-email");
      assert.equal(typeof status.tokens, "number");
      assert.equal(status.fallbackActive, false);
      assert.equal(status.waiters, 0);
      assert.equal(status.queuedTokens, 0);
      assert.ok(status.instanceId > 0, `instance id ${status.instanceId}`);
      // Starting the bucket made the agent one instance of it at the server.
      await started(limiter, server, acme, "schedule-email");
      assert.ok(status.fallbackRate > 0, `fallback rate ${status.fallbackRate}`);
      const units = await limiter.status();
      assert.equal(units.instanceId, status.instanceId);
    } finally {
      limiter.close();
      await agent.stop();
    }
  });

  it("withTokens runs the work with the tokens taken and resolves with its result", async () => {
    const acme = await tenant("with-tokens");
    const agent = await agentFor("with-tokens");
    const limiter = new Limiter({ tenant: acme, socket: agent.socket });
    try {
      const sent = await limiter.withTokens("schedule-email", 25, async () => "sent 25 emails");
      assert.equal(sent, "sent 25 emails");
    } finally {
      limiter.close();
    }
    assert.equal(await agent.stop(), 0);
    const email = await server.bucket(acme, "schedule-email");
    assert.equal(email.consumption.request_unit_micros, 25_000_000);
  });

  it("withTokens gives the tokens back when the work throws, and rethrows", async () => {
    const acme = await tenant("with-tokens-throw");
    const agent = await agentFor("with-tokens-throw");
    const givenBack: Array<{ bucket: string; tokens: number; returned: number }> = [];
    // Records what withTokens gives back, and how much of it the agent took back.
    class RecordingLimiter extends Limiter {
      override async giveBack(bucket: string, tokens: number): Promise<number> {
        const returned = await super.giveBack(bucket, tokens);
        givenBack.push({ bucket, tokens, returned });
        return returned;
      }
    }
    const limiter = new RecordingLimiter({ tenant: acme, socket: agent.socket });
    const failure = new Error("the mail relay is down");
    try {
      await started(limiter, server, acme, "schedule-email");
      await assert.rejects(
        limiter.withTokens("schedule-email", 30, async () => {
          throw failure;
        }),
        (error) => error === failure,
      );
    } finally {
      limiter.close();
    }
    assert.equal(givenBack.length, 1);
    assert.equal(givenBack[0].bucket, "schedule-email");
    assert.equal(givenBack[0].tokens, 30);
    assert.ok(givenBack[0].returned > 0, `returned ${givenBack[0].returned}`);
    assert.equal(await agent.stop(), 0);
    const email = await server.bucket(acme, "schedule-email");
    assert.equal(email.consumption.request_unit_micros, Math.round((30 - givenBack[0].returned) * 1e6));
  });
});
