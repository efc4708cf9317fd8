// The agent's TCP listener: a caller must present the tenant's token from
// the agent's access file; the Unix socket trusts its callers by the file's
// mode. And an answer lost on the way back: the limiter sends the call again
// with the same request id, and the agent answers it without applying it
// twice.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import * as grpc from "@grpc/grpc-js";

import { Limiter, PermissionDeniedError, UnauthenticatedError } from "@tollgate/agent";

import { Agent, LossyRelay, Scratch, Server, freePort } from "./harness";

const ACME_TOKEN = "acme-token-0123456789abcdef";
const GLOBEX_TOKEN = "globex-token-0123456789abcdef";

describe("tcp", () => {
  let scratch: Scratch;
  let server: Server;
  let agent: Agent;

  before(async () => {
    scratch = new Scratch("tcp");
    server = await Server.start(scratch);
    for (const tenant of ["acme", "globex", "initech"]) {
      await server.setLimits(tenant, "schedule-email", 10_000, 100, 10_000);
    }
    agent = await Agent.start(scratch, server, {
      listenPort: await freePort(),
      access: [`[tenants.acme]`, `token = "${ACME_TOKEN}"`, `[tenants.globex]`, `token = "${GLOBEX_TOKEN}"`, ""].join(
        "\n",
      ),
    });
  });
  after(async () => {
    await scratch.close();
  });

  async function denied(
    limiter: Limiter,
    kind: typeof UnauthenticatedError | typeof PermissionDeniedError,
    code: grpc.status,
  ): Promise<void> {
    try {
      for (const call of [() => limiter.tryAcquire("schedule-email", 1), () => limiter.status("schedule-email")]) {
        await assert.rejects(call(), (error) => {
          assert.ok(error instanceof kind, String(error));
          assert.equal(error.code, code);
          return true;
        });
      }
    } finally {
      limiter.close();
    }
  }

  it("a TCP caller with the tenant's token is served", async () => {
    const limiter = new Limiter({ tenant: "acme", address: agent.address, token: ACME_TOKEN });
    try {
      assert.equal(await limiter.tryAcquire("schedule-email", 1), true);
      assert.equal((await limiter.status("schedule-email")).fallbackActive, false);
    } finally {
      limiter.close();
    }
  });

  it("a TCP caller without a token, with a wrong one or another tenant's is unauthenticated", async () => {
    await denied(
      new Limiter({ tenant: "acme", address: agent.address }),
      UnauthenticatedError,
      grpc.status.UNAUTHENTICATED,
    );
    await denied(
      new Limiter({ tenant: "acme", address: agent.address, token: "not-the-token-0123456789" }),
      UnauthenticatedError,
      grpc.status.UNAUTHENTICATED,
    );
    await denied(
      new Limiter({ tenant: "acme", address: agent.address, token: GLOBEX_TOKEN }),
      UnauthenticatedError,
      grpc.status.UNAUTHENTICATED,
    );
  });

  it("a tenant the access file does not list is not served, on either listener", async () => {
    await denied(
      new Limiter({ tenant: "initech", socket: agent.socket }),
      PermissionDeniedError,
      grpc.status.PERMISSION_DENIED,
    );
    await denied(
      new Limiter({ tenant: "initech", address: agent.address, token: ACME_TOKEN }),
      PermissionDeniedError,
      grpc.status.PERMISSION_DENIED,
    );
  });

  it("a socket caller of a listed tenant needs no token", async () => {
    const limiter = new Limiter({ tenant: "globex", socket: agent.socket });
    try {
      assert.equal(await limiter.tryAcquire("schedule-email", 1), true);
    } finally {
      limiter.close();
    }
  });

  it("calls whose answers were lost are sent again with their request ids and applied once", async () => {
    const token = "hooli-token-0123456789abcdef";
    await server.setLimits("hooli", "bulk", 10_000, 100, 10_000);
    const own = await Agent.start(scratch, server, {
      name: "lossy",
      listenPort: await freePort(),
      access: `[tenants.hooli]\ntoken = "${token}"\n`,
    });
    const relay = await LossyRelay.start(own.address as string);
    scratch.onClose(() => relay.close());
    const limiter = new Limiter({ tenant: "hooli", address: relay.address, token });
    try {
      await limiter.status("bulk");
      relay.loseNextAnswer();
      await limiter.charge("bulk", 5);
      relay.loseNextAnswer();
      assert.equal(await limiter.tryAcquire("bulk", 2), true);
      assert.equal(relay.answersLost, 2);
    } finally {
      limiter.close();
    }
    assert.equal(await own.stop(), 0);
    const bulk = await server.bucket("hooli", "bulk");
    assert.equal(bulk.consumption.request_unit_micros, 7_000_000);
  });
});
