// Calls made while the agent is down: the limiter keeps sending them, with
// the same request id, until the agent is back or the call's timeout runs
// out; the agent, restarted on the same state directory, applies each once.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { setTimeout as delay } from "node:timers/promises";

import { AgentUnavailableError, Limiter } from "@tollgate/agent";

import { Agent, LossyRelay, Scratch, Server, freePort, started, stateAfter } from "./harness";

describe("restart", () => {
  let scratch: Scratch;
  let server: Server;

  before(async () => {
    scratch = new Scratch("restart");
    server = await Server.start(scratch);
  });
  after(async () => {
    await scratch.close();
  });

  for (const how of ["stopped", "killed"] as const) {
    it(`calls made while the agent is ${how} succeed once it is back, and are billed once`, async () => {
      const tenant = `restart-${how}`;
      await server.setLimits(tenant, "schedule-email", 10_000, 100, 10_000);
      const agent = await Agent.start(scratch, server, { name: tenant });
      const limiter = new Limiter({ tenant, socket: agent.socket, timeoutMs: 30_000 });
      try {
        // Taken after the first request: unreported when the agent goes away.
        await started(limiter, server, tenant, "schedule-email");
        await limiter.acquire("schedule-email", 3);
        if (how === "stopped") {
          assert.equal(await agent.stop(), 0);
        } else {
          await agent.kill();
        }
        const charge = limiter.charge("schedule-email", 5);
        const acquire = limiter.acquire("schedule-email", 2);
        assert.equal(await stateAfter(charge, 1_000), "pending");
        assert.equal(await stateAfter(acquire, 0), "pending");
        await agent.restart();
        await charge;
        await acquire;
      } finally {
        limiter.close();
      }
      assert.equal(await agent.stop(), 0);
      const email = await server.bucket(tenant, "schedule-email");
      assert.equal(email.consumption.request_unit_micros, 10_000_000);
    });
  }

  it("a charge whose answer was lost before a restart is answered by the restarted agent, not applied again", async () => {
    const tenant = "restart-lost-answer";
    const token = "lost-answer-token-0123456789";
    await server.setLimits(tenant, "schedule-email", 10_000, 100, 10_000);
    const agent = await Agent.start(scratch, server, {
      name: tenant,
      listenPort: await freePort(),
      access: `[tenants.${tenant}]\ntoken = "${token}"\n`,
    });
    const relay = await LossyRelay.start(agent.address as string);
    scratch.onClose(() => relay.close());
    const limiter = new Limiter({ tenant, address: relay.address, token });
    try {
      await started(limiter, server, tenant, "schedule-email");
      relay.loseNextAnswer();
      const charge = limiter.charge("schedule-email", 5);
      // The agent has applied the charge; its answer is lost. Its graceful
      // stop reports the 5 tokens to the server.
      await delay(200);
      assert.equal(await agent.stop(), 0);
      assert.equal((await server.bucket(tenant, "schedule-email")).consumption.request_unit_micros, 5_000_000);
      assert.equal(await stateAfter(charge, 200), "pending");
      await agent.restart();
      await charge;
      assert.equal(relay.answersLost, 1);
    } finally {
      limiter.close();
    }
    assert.equal(await agent.stop(), 0);
    const email = await server.bucket(tenant, "schedule-email");
    assert.equal(email.consumption.request_unit_micros, 5_000_000);
  });

  it("a call gives up with AgentUnavailableError when the agent is not back within timeoutMs", async () => {
    const tenant = "restart-never";
    const agent = await Agent.start(scratch, server, { name: tenant });
    assert.equal(await agent.stop(), 0);
    const limiter = new Limiter({ tenant, socket: agent.socket, timeoutMs: 1_000 });
    try {
      await assert.rejects(limiter.charge("", 1), (error) => {
        assert.ok(error instanceof AgentUnavailableError, String(error));
        assert.equal(error.target, `unix://${agent.socket}`);
        assert.ok(error.attempts > 1, `${error.attempts} attempts`);
        assert.match(error.requestId ?? "", /^[0-9a-f-]{36}$/);
        return true;
      });
    } finally {
      limiter.close();
    }
  });
});
