// What a caller gets wrong, and what the server refuses: each is an error
// of its own kind that names the field or the bucket, and none takes
// anything.

import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";
import * as grpc from "@grpc/grpc-js";

import { BucketRefusedError, InvalidArgumentError, Limiter, TollgateError } from "@tollgate/agent";

import { Agent, Scratch, Server, eventually } from "./harness";

describe("errors", () => {
  let scratch: Scratch;
  let server: Server;
  let agent: Agent;
  let limiter: Limiter;

  before(async () => {
    scratch = new Scratch("errors");
    server = await Server.start(scratch);
    await server.setLimits("acme", "schedule-email", 100, 0, 100);
    agent = await Agent.start(scratch, server);
    limiter = new Limiter({ tenant: "acme", socket: agent.socket });
  });
  after(async () => {
    limiter.close();
    await scratch.close();
  });

  it("a misspelt bucket is refused with BucketRefusedError naming it", async () => {
    // Before the server's first answer the agent may admit the bucket's
    // initial allowance; from that answer on, every call is refused.
    const refusal = await eventually(async () => {
      try {
        await limiter.status("schedule-emial");
      } catch (error) {
        return error;
      }
      throw new Error("status of schedule-emial still answered");
    });
    for (const call of [
      () => refusal,
      () => limiter.acquire("schedule-emial", 1),
      () => limiter.tryAcquire("schedule-emial", 1),
      () => limiter.charge("schedule-emial", 1),
    ]) {
      const error = await (async () => {
        try {
          return await call();
        } catch (error) {
          return error;
        }
      })();
      assert.ok(error instanceof BucketRefusedError, String(error));
      assert.equal(error.code, grpc.status.NOT_FOUND);
      assert.equal(error.tenant, "acme");
      assert.equal(error.bucket, "schedule-emial");
      assert.match(error.message, /schedule-emial/);
    }
  });

  it("tokens out of range are refused by the agent with InvalidArgumentError naming tokens, and nothing is taken", async () => {
    await server.setLimits("invalid", "schedule-email", 100, 0, 100);
    const own = await Agent.start(scratch, server, { name: "invalid" });
    const invalid = new Limiter({ tenant: "invalid", socket: own.socket });
    try {
      for (const tokens of [-1, Number.NaN, Number.POSITIVE_INFINITY, 2e15]) {
        for (const call of [
          () => invalid.acquire("schedule-email", tokens),
          () => invalid.tryAcquire("schedule-email", tokens),
          () => invalid.charge("schedule-email", tokens),
          () => invalid.giveBack("schedule-email", tokens),
        ]) {
          await assert.rejects(call(), (error) => {
            assert.ok(error instanceof InvalidArgumentError, String(error));
            assert.equal(error.code, grpc.status.INVALID_ARGUMENT, "refused by the agent, not before sending");
            assert.equal(error.field, "tokens");
            assert.match(error.message, /tokens/);
            return true;
          });
        }
      }
    } finally {
      invalid.close();
    }
    assert.equal(await own.stop(), 0);
    // Had any of them been taken or charged, the agent's shutdown would have reported it.
    const email = await server.bucket("invalid", "schedule-email");
    assert.equal(email.consumption.request_unit_micros, 0);
  });

  it("other fields out of range are refused with InvalidArgumentError naming them", async () => {
    const cases: Array<[string, () => Promise<unknown>]> = [
      ["max_wait", () => limiter.acquire("schedule-email", 1, { maxWaitMs: -5 })],
      ["max_wait", () => limiter.acquire("schedule-email", 1, { maxWaitMs: 2 * 3_600_000 })],
      ["cpu_seconds", () => limiter.report({ cpuSeconds: -1 })],
      ["bucket", () => limiter.acquire("schedule email", 1)],
      [
        "tenant",
        async () => {
          const misnamed = new Limiter({ tenant: "acme corp", socket: agent.socket });
          try {
            return await misnamed.status("");
          } finally {
            misnamed.close();
          }
        },
      ],
    ];
    for (const [field, call] of cases) {
      await assert.rejects(call(), (error) => {
        assert.ok(error instanceof InvalidArgumentError, `${field}: ${String(error)}`);
        assert.equal(error.code, grpc.status.INVALID_ARGUMENT);
        assert.equal(error.field, field);
        assert.match(error.message, new RegExp(field));
        return true;
      });
    }
  });

  it("values the wire cannot carry are refused before sending, naming the option", async () => {
    const cases: Array<[string, () => Promise<unknown>]> = [
      ["tokens", () => limiter.acquire("schedule-email", "5" as unknown as number)],
      ["bucket", () => limiter.charge(undefined as unknown as string, 1)],
      ["maxWaitMs", () => limiter.acquire("schedule-email", 1, { maxWaitMs: Number.NaN })],
      ["readRequests", () => limiter.report({ readRequests: -1 })],
      ["writeBytes", () => limiter.report({ writeBytes: 1.5 })],
      ["egressBytes", () => limiter.report({ egressBytes: 1n << 64n })],
      ["items[0].key", () => limiter.checkKeys([{ bucket: "api-calls-per-user", key: 42 as unknown as string }])],
    ];
    for (const [field, call] of cases) {
      await assert.rejects(call(), (error) => {
        assert.ok(error instanceof InvalidArgumentError, `${field}: ${String(error)}`);
        assert.equal(error.code, undefined);
        assert.equal(error.field, field);
        assert.match(error.message, new RegExp(field.replace(/[[\].]/g, "\\$&")));
        return true;
      });
    }
    assert.throws(() => new Limiter({ tenant: "acme", timeoutMs: 0 }), {
      name: "InvalidArgumentError",
      field: "timeoutMs",
    });
    assert.throws(() => new Limiter({ tenant: "acme", address: "http://127.0.0.1:1" }), {
      name: "InvalidArgumentError",
      field: "address",
    });
  });

  it("calls after close are refused", async () => {
    const closed = new Limiter({ tenant: "acme", socket: agent.socket });
    closed.close();
    await assert.rejects(
      closed.status("schedule-email"),
      (error) => error instanceof TollgateError && /closed/.test(error.message),
    );
  });

  it("checkKeys passes per-key checks to the server", async () => {
    const keyed = new Limiter({ tenant: "keys", socket: agent.socket });
    try {
      await server.cli(["tier", "apply", "-f", writeTiers(scratch.dir), "--yes"]);
      await server.cli(["tenant", "set-tier", "--tenant", "keys", "--tier", "keyed", "--yes"]);
      const first = await keyed.checkKeys([{ bucket: "api-calls-per-user", key: "user-42", tokens: 2 }]);
      assert.equal(first.allowed, true);
      assert.equal(first.answers.length, 1);
      assert.equal(first.answers[0].remainingTokens, 1);
      assert.equal(first.answers[0].burstLimit, 3);
      assert.equal(first.answers[0].retryAfterMs, 0);

      const second = await keyed.checkKeys([
        { bucket: "api-calls-per-user", key: "user-42", tokens: 1 },
        { bucket: "api-calls-per-user", key: "user-7", tokens: 3 },
      ]);
      assert.equal(second.allowed, true);
      // Next to nothing is left of either key (they refill at 0.001 per second).
      for (const answer of second.answers) {
        assert.ok(answer.allowed);
        assert.ok(answer.remainingTokens < 0.01, `remaining ${answer.remainingTokens}`);
      }

      const refused = await keyed.checkKeys([{ bucket: "api-calls-per-user", key: "user-42", tokens: 1 }]);
      assert.equal(refused.allowed, false);
      assert.equal(refused.answers[0].allowed, false);
      assert.ok((refused.answers[0].retryAfterMs ?? 0) > 0, `retry after ${refused.answers[0].retryAfterMs}`);

      // The same request id is answered from the first check's record.
      const replay = await keyed.checkKeys([
        { bucket: "api-calls-per-user", key: "user-99", tokens: 1, requestId: "r-1" },
      ]);
      const again = await keyed.checkKeys([
        { bucket: "api-calls-per-user", key: "user-99", tokens: 1, requestId: "r-1" },
      ]);
      assert.equal(replay.answers[0].replayed, false);
      assert.equal(again.answers[0].replayed, true);
      assert.equal(again.answers[0].remainingTokens, replay.answers[0].remainingTokens);

      await assert.rejects(keyed.checkKeys([{ bucket: "api-calls-per-usr", key: "user-42" }]), (error) => {
        assert.ok(error instanceof BucketRefusedError, String(error));
        assert.equal(error.code, grpc.status.NOT_FOUND);
        assert.equal(error.bucket, "api-calls-per-usr");
        return true;
      });
    } finally {
      keyed.close();
    }
  });
});

/** A tier `keyed` with one shared and one per-key bucket. */
function writeTiers(dir: string): string {
  const file = path.join(dir, "tiers.toml");
  fs.writeFileSync(
    file,
    [
      "[tiers.keyed.buckets.schedule-email]",
      "refill_rate = 0",
      "burst_limit = 100",
      "[tiers.keyed.buckets.api-calls-per-user]",
      'kind = "per-key"',
      "refill_rate = 0.001",
      "burst_limit = 3",
      "",
    ].join("\n"),
  );
  return file;
}
