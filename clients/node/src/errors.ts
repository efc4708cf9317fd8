/**
 * The errors a `Limiter` call rejects with.
 *
 * Callers tell apart what to do next, not which RPC failed: wait less or
 * shed the work (`NotAdmittedError`), fix the call (`InvalidArgumentError`),
 * fix the configuration (`BucketRefusedError`, `UnauthenticatedError`,
 * `PermissionDeniedError`), or look at the agent (`AgentUnavailableError`).
 * Every one is a `TollgateError`, and carries the gRPC status code of the
 * agent's answer when there was one.
 */

import { status as Status } from "@grpc/grpc-js";

/** Options every error takes: the agent's status code, and what caused it. */
export interface TollgateErrorOptions {
  /** The gRPC status code of the agent's answer; unset if the call was refused before it was sent. */
  code?: Status;
  cause?: unknown;
}

/** The base of every error the package throws. */
export class TollgateError extends Error {
  /** The gRPC status code of the agent's answer; unset if the call was refused before it was sent. */
  readonly code: Status | undefined;

  constructor(message: string, options: TollgateErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = options.code;
  }
}

/** An acquire that was not admitted within its `maxWaitMs` (or its call's deadline); nothing was taken. */
export class NotAdmittedError extends TollgateError {
  readonly tenant: string;
  /** The bucket; `""` is the tenant's request-unit bucket. */
  readonly bucket: string;
  readonly tokens: number;
  /** How long the call waited, in milliseconds. */
  readonly waitedMs: number;

  constructor(tenant: string, bucket: string, tokens: number, waitedMs: number, options: TollgateErrorOptions = {}) {
    super(
      `tenant "${tenant}" ${bucketPhrase(bucket)}: ${tokens} tokens not admitted after waiting ${Math.round(waitedMs)} ms`,
      options,
    );
    this.tenant = tenant;
    this.bucket = bucket;
    this.tokens = tokens;
    this.waitedMs = waitedMs;
  }
}

/**
 * The server refused the bucket for good: it does not exist (`NOT_FOUND`: a
 * misspelt or retired bucket), the agent may not act for the tenant
 * (`PERMISSION_DENIED`), the tenant is suspended (`FAILED_PRECONDITION`), …
 * Every call on the bucket fails the same way until the agent restarts;
 * retrying does not help.
 */
export class BucketRefusedError extends TollgateError {
  declare readonly code: Status;
  readonly tenant: string;
  /** The bucket; `""` is the tenant's request-unit bucket. */
  readonly bucket: string;

  /** `details` is the agent's message, which names the tenant and the bucket when the server refused it. */
  constructor(tenant: string, bucket: string, code: Status, details: string, options: { cause?: unknown } = {}) {
    const named = details.includes(`bucket "${bucket}"`);
    super(named ? details : `tenant "${tenant}" ${bucketPhrase(bucket)} refused: ${Status[code]}: ${details}`, {
      ...options,
      code,
    });
    this.tenant = tenant;
    this.bucket = bucket;
  }
}

/** A field of the call out of its documented range; nothing was taken. `field` names it. */
export class InvalidArgumentError extends TollgateError {
  /** The offending field as the agent names it (`tokens`, `max_wait`, `items[1].key`), or the option's name. */
  readonly field: string | undefined;

  constructor(message: string, field: string | undefined, options: TollgateErrorOptions = {}) {
    super(message, options);
    this.field = field;
  }
}

/** A TCP caller without the tenant's token, or with a wrong one. */
export class UnauthenticatedError extends TollgateError {}

/** The agent's configuration does not let this caller use the tenant. */
export class PermissionDeniedError extends TollgateError {}

/**
 * The agent could not be reached, or did not answer, within the call's
 * `timeoutMs`, retries included. For a call that changes a bucket,
 * `requestId` is the id every attempt carried: the agent may have applied
 * it, and a new call is a new change.
 */
export class AgentUnavailableError extends TollgateError {
  /** The gRPC target the limiter talks to (`unix:///run/tollgate/agent.sock`). */
  readonly target: string;
  readonly requestId: string | undefined;
  readonly attempts: number;

  constructor(
    message: string,
    target: string,
    requestId: string | undefined,
    attempts: number,
    options: TollgateErrorOptions = {},
  ) {
    super(message, options);
    this.target = target;
    this.requestId = requestId;
    this.attempts = attempts;
  }
}

function bucketPhrase(bucket: string): string {
  return bucket === "" ? "request-unit bucket" : `bucket "${bucket}"`;
}
