// Acquisitions that wait: for at most `maxWaitMs`, until the call's
// timeout, or until their AbortSignal fires, which takes them out of the
// bucket's queue in the agent.
//
// The bucket `frozen` never refills: it holds what the server hands out of
// its 100 tokens, so an acquisition of 1e12 tokens waits for good, and is
// the first in the queue in front of any later one (first come, first
// served).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Limiter, NotAdmittedError } from "@tollgate/agent";

import { Agent, Scratch, Server, eventually, stateAfter } from "./harness";

const NEVER = 1e12;

describe("waiting", () => {
  let scratch: Scratch;
  let server: Server;

  before(async () => {
    scratch = new Scratch("waiting");
    server = await Server.start(scratch);
  });
  after(async () => {
    await scratch.close();
  });

  async function setUp(name: string): Promise<{ agent: Agent; limiter: Limiter }> {
    await server.setLimits(name, "frozen", 100, 0, 100);
    const agent = await Agent.start(scratch, server, { name });
    return { agent, limiter: new Limiter({ tenant: name, socket: agent.socket }) };
  }

  async function queued(limiter: Limiter, waiters: number, tokens: number): Promise<void> {
    await eventually(async () => {
      const status = await limiter.status("frozen");
      assert.equal(status.waiters, waiters);
      assert.equal(status.queuedTokens, tokens);
    });
  }

  it("an aborted acquire leaves the queue: a later acquire gets the tokens", async () => {
    const { agent, limiter } = await setUp("abort");
    try {
      const controller = new AbortController();
      const waiting = limiter.acquire("frozen", NEVER, { signal: controller.signal });
      await queued(limiter, 1, NEVER);
      assert.equal(await stateAfter(waiting, 100), "pending");

      const reason = new Error("the user closed the page");
      controller.abort(reason);
      await assert.rejects(waiting, (error) => error === reason);
      await queued(limiter, 0, 0);

      // Behind the first waiter this would wait for good.
      const admission = await limiter.acquire("frozen", 1, { maxWaitMs: 10_000 });
      assert.equal(admission.fallback, false);
    } finally {
      limiter.close();
    }
    assert.equal(await agent.stop(), 0);
    // The aborted acquisition took nothing.
    const frozen = await server.bucket("abort", "frozen");
    assert.equal(frozen.consumption.request_unit_micros, 1_000_000);
  });

  it("an acquire whose signal has already fired is not sent", async () => {
    const { agent, limiter } = await setUp("aborted-before");
    try {
      const controller = new AbortController();
      controller.abort();
      await assert.rejects(limiter.acquire("frozen", 1, { signal: controller.signal }), { name: "AbortError" });
      await assert.rejects(limiter.acquire("frozen", NEVER, { signal: AbortSignal.timeout(200) }), {
        name: "TimeoutError",
      });
      await queued(limiter, 0, 0);
    } finally {
      limiter.close();
    }
    assert.equal(await agent.stop(), 0);
    const frozen = await server.bucket("aborted-before", "frozen");
    assert.equal(frozen.consumption.request_unit_micros, 0);
  });

  it("an acquire not admitted within maxWaitMs rejects with NotAdmittedError and takes nothing", async () => {
    const { agent, limiter } = await setUp("max-wait");
    try {
      await assert.rejects(limiter.acquire("frozen", NEVER, { maxWaitMs: 300 }), (error) => {
        assert.ok(error instanceof NotAdmittedError, String(error));
        assert.equal(error.tenant, "max-wait");
        assert.equal(error.bucket, "frozen");
        assert.equal(error.tokens, NEVER);
        assert.ok(error.waitedMs >= 250, `waited ${error.waitedMs} ms`);
        assert.match(error.message, /bucket "frozen"/);
        return true;
      });
      await queued(limiter, 0, 0);
    } finally {
      limiter.close();
    }
    assert.equal(await agent.stop(), 0);
    const frozen = await server.bucket("max-wait", "frozen");
    assert.equal(frozen.consumption.request_unit_micros, 0);
  });

  it("an acquire without maxWaitMs is not admitted past the limiter's timeoutMs", async () => {
    const { agent } = await setUp("timeout");
    const limiter = new Limiter({ tenant: "timeout", socket: agent.socket, timeoutMs: 500 });
    try {
      await assert.rejects(limiter.acquire("frozen", NEVER), (error) => {
        assert.ok(error instanceof NotAdmittedError, String(error));
        assert.equal(error.bucket, "frozen");
        return true;
      });
      await queued(limiter, 0, 0);
    } finally {
      limiter.close();
      await agent.stop();
    }
  });
});
