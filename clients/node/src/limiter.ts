/**
 * `Limiter`: a Node service's handle on one tenant's buckets, held by the
 * `tollgate agent` beside it.
 *
 * Every decision is the agent's: this module only turns calls into the
 * agent's gRPC API and its answers into promises and errors. It keeps no
 * bucket state, so a service written in TypeScript gets the same local
 * buckets, fallback and exact accounting as a Rust pod embedding
 * `tollgate-client`, at the cost of a local call.
 *
 * What it adds is what a call over a socket needs to stay exact when the
 * agent restarts: every call that changes a bucket carries a fresh request
 * id, and a call that finds the agent unreachable (`UNAVAILABLE`) or still
 * busy with the same id (`ABORTED`) is sent again with the same id until its
 * deadline. The agent remembers each id's answer across its restarts, so a
 * repeat is answered, not applied twice.
 */

import * as grpc from "@grpc/grpc-js";
import { randomUUID } from "node:crypto";
import * as path from "node:path";

import {
  AgentUnavailableError,
  BucketRefusedError,
  InvalidArgumentError,
  NotAdmittedError,
  PermissionDeniedError,
  TollgateError,
  UnauthenticatedError,
} from "./errors";
import type { Duration, Duration__Output } from "./generated/google/protobuf/Duration";
import type { AcquireResponse__Output } from "./generated/tollgate/agent/v1/AcquireResponse";
import type { AgentClient } from "./generated/tollgate/agent/v1/Agent";
import type { ChargeResponse__Output } from "./generated/tollgate/agent/v1/ChargeResponse";
import type { ReportResponse__Output } from "./generated/tollgate/agent/v1/ReportResponse";
import type { ReturnResponse__Output } from "./generated/tollgate/agent/v1/ReturnResponse";
import type { StatusResponse__Output } from "./generated/tollgate/agent/v1/StatusResponse";
import type { CheckResponse__Output } from "./generated/tollgate/v1/CheckResponse";
import { agentClientConstructor } from "./loader";

const Status = grpc.status;

/** Where the agent listens unless told otherwise. */
export const DEFAULT_SOCKET = "/run/tollgate/agent.sock";
/** How long a call may take, retries included, unless told otherwise. */
export const DEFAULT_TIMEOUT_MS = 30_000;

// Pauses between attempts while the agent cannot be reached: short at
// first (an agent restarting is back within a second), never longer than a
// second, with jitter so the callers of a restarted agent do not return in
// step.
const FIRST_BACKOFF_MS = 25;
const MAX_BACKOFF_MS = 1_000;
// An attempt with less time than this left is not worth starting: it would
// end in DEADLINE_EXCEEDED, which says less than the UNAVAILABLE before it.
const MIN_ATTEMPT_MS = 50;
// An acquire that may wait `maxWaitMs` gets this much longer for the
// agent's answer to arrive.
const ANSWER_GRACE_MS = 2_000;

// grpc-js backs off up to two minutes between reconnections by default; an
// agent that restarts is back in about a second, and the calls retrying on
// it should find the channel reconnected by then.
const CHANNEL_OPTIONS: grpc.ChannelOptions = {
  "grpc.initial_reconnect_backoff_ms": 100,
  "grpc.max_reconnect_backoff_ms": 1_000,
};

export interface LimiterOptions {
  /** The tenant every call acts for: 1 to 128 characters from `[A-Za-z0-9._:-]`. */
  tenant: string;
  /** The agent's Unix socket. Default `/run/tollgate/agent.sock`. Ignored when `address` is given. */
  socket?: string;
  /** The agent's TCP listener, `host:port` (`127.0.0.1:7070`), instead of its socket. */
  address?: string;
  /** The tenant's token, sent as `authorization: Bearer <token>`: the agent requires it from TCP callers. */
  token?: string;
  /** How long a call may take, retries while the agent is unreachable included. Default 30 000. */
  timeoutMs?: number;
}

export interface CallOptions {
  /** Cancels the call: it rejects with the signal's reason and is sent no more. */
  signal?: AbortSignal;
}

export interface AcquireOptions extends CallOptions {
  /**
   * How long to wait at most, 0 to 3 600 000. Unset: until the call's
   * `timeoutMs`, and at most the agent's `--max-wait` (30 s by default). A
   * longer `maxWaitMs` than `timeoutMs` extends the call's deadline.
   */
  maxWaitMs?: number;
}

/** An acquire that was admitted. */
export interface Admission {
  /** How long the call waited in the bucket's queue, in milliseconds. */
  waitedMs: number;
  /**
   * True if the tokens came from the fallback rate: the server was not
   * reachable, and they are charged to the tenant when it is back.
   */
  fallback: boolean;
}

/**
 * Key-value work by kind, priced by the agent's cost model. Counts are whole
 * numbers from 0 to 2^64 - 1 (a `bigint` beyond `Number.MAX_SAFE_INTEGER`);
 * those left out are 0.
 */
export interface Usage {
  readRequests?: number | bigint;
  readBytes?: number | bigint;
  writeRequests?: number | bigint;
  writeBytes?: number | bigint;
  /** Finite, 0 to 1e9. */
  cpuSeconds?: number;
  egressBytes?: number | bigint;
}

/** The agent's local bucket as it is now. */
export interface BucketStatus {
  /** Tokens in the local bucket now. */
  tokens: number;
  /** Tokens owed for work charged after the fact. */
  debt: number;
  /** Tokens per second arriving from the server's last grant (0 if none). */
  trickleRate: number;
  /** True while the server cannot be reached and the bucket refills at `fallbackRate`. */
  fallbackActive: boolean;
  /** Tokens per second the bucket refills at while the server cannot be reached. */
  fallbackRate: number;
  /** Acquisitions waiting. */
  waiters: number;
  /** The tokens they wait for. */
  queuedTokens: number;
  /** The bucket's recent use, tokens per second. */
  usageRate: number;
  /** The agent's instance id for the tenant's buckets. */
  instanceId: number;
}

/** One key of a per-key bucket, checked by `checkKeys`. */
export interface KeyCheck {
  /** A per-key bucket definition of the tenant (`api-calls-per-user`). */
  bucket: string;
  /** The caller's key: a user id, an API key hash, an IP address. */
  key: string;
  /** Tokens to take: finite, 0 to 1e15; 0 reads without taking. Default 1. */
  tokens?: number;
  /** The caller's name for this check, for retries; unset: one fresh id for the whole call. */
  requestId?: string;
}

/** The answer for one key. */
export interface KeyAnswer {
  /** True if this item's tokens were taken. */
  allowed: boolean;
  /** Tokens the key holds after the check. */
  remainingTokens: number;
  /** When the tokens asked for will be there, in milliseconds: 0 if allowed; null if never. */
  retryAfterMs: number | null;
  /** When the key will be full again, in milliseconds: 0 if it is; null if never. */
  resetAfterMs: number | null;
  refillRate: number;
  burstLimit: number;
  /** True if this is a retry answered from the first check's record. */
  replayed: boolean;
}

export interface KeyCheckResult {
  /** True if every item was allowed (and so taken). */
  allowed: boolean;
  /** One answer per item, in the order of the request. */
  answers: KeyAnswer[];
}

/** What a failed call was about, for the error it rejects with. */
interface CallContext {
  rpc: string;
  /** The bucket the call names (`""`: the request-unit bucket), or those of a per-key check. */
  buckets: string[];
  requestId: string | undefined;
  /** How long the call may take, retries included. */
  budgetMs: number;
  /** Epoch milliseconds after which no attempt is made. */
  deadline: number;
  signal: AbortSignal | undefined;
}

type Attempt<Res> = (
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: grpc.requestCallback<Res>,
) => grpc.ClientUnaryCall;

/**
 * One tenant's buckets through the local agent. Cheap to keep for the life
 * of the process (one connection); `close()` it on the way out.
 *
 * Bucket `""` is the tenant's request-unit bucket; any other name is one of
 * its shared action buckets (`schedule-email`).
 */
export class Limiter {
  readonly tenant: string;
  /** The gRPC target: `unix:///run/tollgate/agent.sock` or `127.0.0.1:7070`. */
  readonly target: string;
  readonly timeoutMs: number;
  private readonly client: AgentClient;
  private readonly token: string | undefined;
  private closed = false;

  constructor(options: LimiterOptions) {
    if (typeof options !== "object" || options === null) {
      throw new InvalidArgumentError("options: must be an object with at least `tenant`", "options");
    }
    this.tenant = stringOption("tenant", options.tenant);
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    if (typeof this.timeoutMs !== "number" || !Number.isFinite(this.timeoutMs) || this.timeoutMs <= 0) {
      throw new InvalidArgumentError(
        `timeoutMs: must be a finite number above 0, got ${String(options.timeoutMs)}`,
        "timeoutMs",
      );
    }
    if (options.token !== undefined) {
      this.token = stringOption("token", options.token);
    }
    if (options.address !== undefined) {
      const address = stringOption("address", options.address);
      if (address === "" || address.includes("://") || !address.includes(":")) {
        throw new InvalidArgumentError(`address: must be host:port (127.0.0.1:7070), got "${address}"`, "address");
      }
      this.target = address;
    } else {
      const socket = stringOption("socket", options.socket ?? DEFAULT_SOCKET);
      if (socket === "") {
        throw new InvalidArgumentError("socket: must be a path, got an empty string", "socket");
      }
      this.target = `unix://${path.resolve(socket)}`;
    }
    const Client = agentClientConstructor();
    this.client = new Client(this.target, grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
  }

  /**
   * Waits until `tokens` are in the bucket and takes them all at once.
   * Waiters of a bucket are served first come, first served, across every
   * pod of the agent. Resolves when admitted; rejects with
   * `NotAdmittedError` (nothing taken) when not admitted within
   * `maxWaitMs`. Aborting `signal` takes the call out of the queue and
   * rejects with the signal's reason.
   */
  async acquire(bucket = "", tokens = 1, options: AcquireOptions = {}): Promise<Admission> {
    checkBucket(bucket);
    checkTokens(tokens);
    const { maxWaitMs, signal } = options;
    let maxWait: Duration | undefined;
    if (maxWaitMs !== undefined) {
      if (typeof maxWaitMs !== "number" || !Number.isFinite(maxWaitMs)) {
        throw new InvalidArgumentError(`maxWaitMs: must be a finite number, got ${String(maxWaitMs)}`, "maxWaitMs");
      }
      maxWait = durationFromMs(maxWaitMs);
    }
    const requestId = randomUUID();
    const started = Date.now();
    const ctx = this.context(
      "Acquire",
      [bucket],
      requestId,
      signal,
      Math.max(this.timeoutMs, (maxWaitMs ?? 0) + ANSWER_GRACE_MS),
    );
    const request = { tenant: this.tenant, bucket, tokens, maxWait, requestId };
    const response = await this.call<AcquireResponse__Output>(
      ctx,
      (md, opts, cb) => this.client.acquire(request, md, opts, cb),
      (error) =>
        // Without `maxWaitMs` the agent waits until the call's own deadline:
        // running out of it is not being admitted. With it, the agent
        // answers well before the deadline, and one that did not is
        // unavailable.
        error.code === Status.DEADLINE_EXCEEDED && maxWaitMs === undefined
          ? new NotAdmittedError(this.tenant, bucket, tokens, Date.now() - started, { code: error.code, cause: error })
          : undefined,
    );
    const waitedMs = msFromDuration(response.waited) ?? 0;
    if (!response.admitted) {
      throw new NotAdmittedError(this.tenant, bucket, tokens, waitedMs);
    }
    return { waitedMs, fallback: response.fallback };
  }

  /**
   * Acquires `tokens`, runs `work`, and resolves with what it returns. If
   * `work` throws, the tokens are given back (those not yet reported to
   * the server) and the error is rethrown.
   */
  async withTokens<T>(
    bucket: string,
    tokens: number,
    work: () => Promise<T> | T,
    options: AcquireOptions = {},
  ): Promise<T> {
    if (typeof work !== "function") {
      throw new InvalidArgumentError(`work: must be a function, got ${typeof work}`, "work");
    }
    await this.acquire(bucket, tokens, options);
    try {
      return await work();
    } catch (error) {
      try {
        await this.giveBack(bucket, tokens);
      } catch (giveBackError) {
        // The work's error is what the caller must see; the tokens stay
        // charged, which never admits more than the bucket allows.
        process.emitWarning(
          `tollgate: could not give back ${tokens} tokens of tenant "${this.tenant}" bucket "${bucket}" after the work failed: ${String(giveBackError)}`,
          { code: "TOLLGATE_GIVE_BACK_FAILED" },
        );
      }
      throw error;
    }
  }

  /** Takes `tokens` if the bucket holds them now; never waits. Resolves with whether they were taken. */
  async tryAcquire(bucket = "", tokens = 1, options: CallOptions = {}): Promise<boolean> {
    checkBucket(bucket);
    checkTokens(tokens);
    const requestId = randomUUID();
    const ctx = this.context("TryAcquire", [bucket], requestId, options.signal);
    const request = { tenant: this.tenant, bucket, tokens, requestId };
    const response = await this.call<AcquireResponse__Output>(ctx, (md, opts, cb) =>
      this.client.tryAcquire(request, md, opts, cb),
    );
    return response.admitted;
  }

  /**
   * Charges `tokens` after the fact, for work whose cost is known once done:
   * never waits, may put the bucket in debt, paid from its refills.
   */
  async charge(bucket: string, tokens: number, options: CallOptions = {}): Promise<void> {
    checkBucket(bucket);
    checkTokens(tokens);
    const requestId = randomUUID();
    const ctx = this.context("Charge", [bucket], requestId, options.signal);
    const request = { tenant: this.tenant, bucket, tokens, requestId };
    await this.call<ChargeResponse__Output>(ctx, (md, opts, cb) => this.client.charge(request, md, opts, cb));
  }

  /**
   * Reports key-value work by kind, charged after the fact to the tenant's
   * request-unit bucket. Resolves with what it cost in request units.
   */
  async report(usage: Usage, options: CallOptions = {}): Promise<number> {
    if (typeof usage !== "object" || usage === null) {
      throw new InvalidArgumentError(
        `usage: must be an object, got ${usage === null ? "null" : typeof usage}`,
        "usage",
      );
    }
    const cpuSeconds = usage.cpuSeconds ?? 0;
    checkNumber("cpuSeconds", cpuSeconds);
    const requestId = randomUUID();
    const request = {
      tenant: this.tenant,
      readRequests: uint64("readRequests", usage.readRequests),
      readBytes: uint64("readBytes", usage.readBytes),
      writeRequests: uint64("writeRequests", usage.writeRequests),
      writeBytes: uint64("writeBytes", usage.writeBytes),
      cpuSeconds,
      egressBytes: uint64("egressBytes", usage.egressBytes),
      requestId,
    };
    const ctx = this.context("Report", [""], requestId, options.signal);
    const response = await this.call<ReportResponse__Output>(ctx, (md, opts, cb) =>
      this.client.report(request, md, opts, cb),
    );
    return response.requestUnits;
  }

  /**
   * Gives back tokens taken for work that did not run. Only tokens not yet
   * reported to the server come back: resolves with how many did.
   */
  async giveBack(bucket: string, tokens: number, options: CallOptions = {}): Promise<number> {
    checkBucket(bucket);
    checkTokens(tokens);
    const requestId = randomUUID();
    const ctx = this.context("Return", [bucket], requestId, options.signal);
    const request = { tenant: this.tenant, bucket, tokens, requestId };
    const response = await this.call<ReturnResponse__Output>(ctx, (md, opts, cb) =>
      this.client.return(request, md, opts, cb),
    );
    return response.returned;
  }

  /** The agent's local bucket as it is now; starts the bucket if the agent does not hold it yet. */
  async status(bucket = "", options: CallOptions = {}): Promise<BucketStatus> {
    checkBucket(bucket);
    const ctx = this.context("Status", [bucket], undefined, options.signal);
    const request = { tenant: this.tenant, bucket };
    const response = await this.call<StatusResponse__Output>(ctx, (md, opts, cb) =>
      this.client.status(request, md, opts, cb),
    );
    return {
      tokens: response.tokens,
      debt: response.debt,
      trickleRate: response.trickleRate,
      fallbackActive: response.fallbackActive,
      fallbackRate: response.fallbackRate,
      waiters: Number(response.waiters),
      queuedTokens: response.queuedTokens,
      usageRate: response.usageRate,
      instanceId: response.instanceId,
    };
  }

  /**
   * An exact per-key check, passed by the agent to the server (one round
   * trip): takes each item's tokens from its key, all of them or none.
   */
  async checkKeys(items: readonly KeyCheck[], options: CallOptions = {}): Promise<KeyCheckResult> {
    if (!Array.isArray(items)) {
      throw new InvalidArgumentError(`items: must be an array, got ${typeof items}`, "items");
    }
    // Items without an id share one, so that a retry of the call is
    // answered from the first check's record instead of taking again.
    const callId = randomUUID();
    const request = {
      items: items.map((item, i) => {
        if (typeof item !== "object" || item === null) {
          throw new InvalidArgumentError(`items[${i}]: must be an object with bucket and key`, `items[${i}]`);
        }
        const tokens = item.tokens ?? 1;
        checkNumber(`items[${i}].tokens`, tokens);
        return {
          tenantId: this.tenant,
          bucket: stringOption(`items[${i}].bucket`, item.bucket),
          key: stringOption(`items[${i}].key`, item.key),
          tokens,
          requestId: item.requestId === undefined ? callId : stringOption(`items[${i}].requestId`, item.requestId),
        };
      }),
    };
    const buckets = [...new Set(request.items.map((item) => item.bucket))];
    const ctx = this.context("CheckKeys", buckets, callId, options.signal);
    const response = await this.call<CheckResponse__Output>(ctx, (md, opts, cb) =>
      this.client.checkKeys(request, md, opts, cb),
    );
    return {
      allowed: response.allowed,
      answers: response.answers.map((answer) => ({
        allowed: answer.allowed,
        remainingTokens: answer.remainingTokens,
        retryAfterMs: msFromDuration(answer.retryAfter),
        resetAfterMs: msFromDuration(answer.resetAfter),
        refillRate: answer.refillRate,
        burstLimit: answer.burstLimit,
        replayed: answer.replayed,
      })),
    };
  }

  /** Closes the connection to the agent. Calls made after it are refused. */
  close(): void {
    if (!this.closed) {
      this.closed = true;
      this.client.close();
    }
  }

  private context(
    rpc: string,
    buckets: string[],
    requestId: string | undefined,
    signal: AbortSignal | undefined,
    budgetMs = this.timeoutMs,
  ): CallContext {
    if (signal !== undefined && !isAbortSignal(signal)) {
      throw new InvalidArgumentError("signal: must be an AbortSignal", "signal");
    }
    return { rpc, buckets, requestId, budgetMs, deadline: Date.now() + budgetMs, signal };
  }

  /**
   * Makes the call, again with the same request while the agent is
   * unreachable or busy with the same request id, until the deadline.
   * `special` may turn an error into the one the caller should see.
   */
  private async call<Res>(
    ctx: CallContext,
    attempt: Attempt<Res>,
    special: (error: grpc.ServiceError) => TollgateError | undefined = () => undefined,
  ): Promise<Res> {
    const { signal } = ctx;
    let attempts = 0;
    let backoffMs = FIRST_BACKOFF_MS;
    for (;;) {
      throwIfAborted(signal);
      if (this.closed) {
        throw new TollgateError(`${ctx.rpc}: the limiter is closed`);
      }
      attempts += 1;
      let error: grpc.ServiceError;
      try {
        return await this.attempt(ctx, attempt);
      } catch (thrown) {
        throwIfAborted(signal);
        if (!isServiceError(thrown)) {
          throw thrown;
        }
        error = thrown;
      }
      const retryable = error.code === Status.UNAVAILABLE || error.code === Status.ABORTED;
      if (!retryable) {
        throw special(error) ?? this.failure(ctx, error, attempts);
      }
      const pauseMs = backoffMs * (0.5 + Math.random() / 2);
      if (Date.now() + pauseMs + MIN_ATTEMPT_MS > ctx.deadline) {
        throw this.failure(ctx, error, attempts);
      }
      await sleep(pauseMs, signal);
      backoffMs = Math.min(backoffMs * 2, MAX_BACKOFF_MS);
    }
  }

  private attempt<Res>(ctx: CallContext, attempt: Attempt<Res>): Promise<Res> {
    return new Promise((resolve, reject) => {
      const metadata = new grpc.Metadata();
      if (this.token !== undefined) {
        metadata.set("authorization", `Bearer ${this.token}`);
      }
      const { signal } = ctx;
      let call: grpc.ClientUnaryCall | undefined;
      // Cancelling the call resets its stream: the agent sees the caller go
      // away and takes the waiter out of the bucket's queue.
      const onAbort = (): void => call?.cancel();
      try {
        call = attempt(metadata, { deadline: new Date(ctx.deadline) }, (error, response) => {
          signal?.removeEventListener("abort", onAbort);
          if (error) {
            reject(error);
          } else if (response === undefined) {
            reject(new TollgateError(`${ctx.rpc}: the agent answered without a message`));
          } else {
            resolve(response);
          }
        });
      } catch (error) {
        reject(error);
        return;
      }
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  private failure(ctx: CallContext, error: grpc.ServiceError, attempts: number): TollgateError {
    const { code, details } = error;
    const options = { code, cause: error };
    switch (code) {
      case Status.INVALID_ARGUMENT:
        return new InvalidArgumentError(`${ctx.rpc}: ${details}`, fieldNamedIn(details), options);
      case Status.UNAUTHENTICATED:
        return new UnauthenticatedError(`${ctx.rpc}: tenant "${this.tenant}": ${details}`, options);
      case Status.PERMISSION_DENIED:
        // The server's refusal of a bucket, which the agent passes on, names
        // the bucket; the agent's own refusal of a caller does not.
        return namesBucket(details, ctx.buckets)
          ? this.refused(ctx, code, details, error)
          : new PermissionDeniedError(`${ctx.rpc}: tenant "${this.tenant}": ${details}`, options);
      case Status.NOT_FOUND:
      case Status.FAILED_PRECONDITION:
      case Status.OUT_OF_RANGE:
        return this.refused(ctx, code, details, error);
      case Status.UNAVAILABLE:
      case Status.ABORTED:
      case Status.DEADLINE_EXCEEDED: {
        const what = code === Status.DEADLINE_EXCEEDED ? "did not answer" : "could not be reached";
        const retried =
          attempts > 1 ? ` (${attempts} attempts${ctx.requestId ? ` with request id ${ctx.requestId}` : ""})` : "";
        return new AgentUnavailableError(
          `${ctx.rpc}: the tollgate agent at ${this.target} ${what} within ${ctx.budgetMs} ms${retried}: ${grpc.status[code]}: ${details}`,
          this.target,
          ctx.requestId,
          attempts,
          options,
        );
      }
      default:
        return new TollgateError(`${ctx.rpc}: ${grpc.status[code]}: ${details}`, options);
    }
  }

  private refused(ctx: CallContext, code: grpc.status, details: string, cause: grpc.ServiceError): BucketRefusedError {
    const bucket =
      ctx.buckets.length === 1
        ? ctx.buckets[0]
        : (ctx.buckets.find((b) => details.includes(`"${b}"`)) ?? ctx.buckets.join(","));
    return new BucketRefusedError(this.tenant, bucket, code, details, { cause });
  }
}

function stringOption(field: string, value: unknown): string {
  if (typeof value !== "string") {
    throw new InvalidArgumentError(`${field}: must be a string, got ${value === null ? "null" : typeof value}`, field);
  }
  return value;
}

function checkBucket(bucket: unknown): asserts bucket is string {
  stringOption("bucket", bucket);
}

function checkNumber(field: string, value: unknown): asserts value is number {
  if (typeof value !== "number") {
    throw new InvalidArgumentError(`${field}: must be a number, got ${typeof value}`, field);
  }
}

// Only the type is checked here: the range (finite, 0 to 1e15) is the
// agent's to judge, and it names the field.
function checkTokens(tokens: unknown): asserts tokens is number {
  checkNumber("tokens", tokens);
}

const UINT64_MAX = (1n << 64n) - 1n;

/** A count as the protobuf encoder takes a uint64 exactly: a decimal string. */
function uint64(field: string, value: number | bigint | undefined): string {
  if (value === undefined) {
    return "0";
  }
  if (typeof value === "number" && Number.isSafeInteger(value) && value >= 0) {
    return String(value);
  }
  if (typeof value === "bigint" && value >= 0n && value <= UINT64_MAX) {
    return value.toString();
  }
  throw new InvalidArgumentError(
    `${field}: must be a whole number from 0 to 2^64 - 1 (a bigint above 2^53 - 1), got ${String(value)}`,
    field,
  );
}

function durationFromMs(ms: number): Duration {
  const totalNanos = Math.round(ms * 1e6);
  const seconds = Math.trunc(totalNanos / 1e9);
  return { seconds: String(seconds), nanos: totalNanos - seconds * 1e9 };
}

function msFromDuration(duration: Duration__Output | null): number | null {
  return duration === null ? null : Number(duration.seconds) * 1e3 + duration.nanos / 1e6;
}

/**
 * The field an INVALID_ARGUMENT message names: the agent and the server
 * write it first (`tokens: must be finite`), or in backquotes.
 */
function fieldNamedIn(details: string): string | undefined {
  const leading = /^([A-Za-z_][\w.[\]]*):/.exec(details);
  if (leading) {
    return leading[1];
  }
  const quoted = /`([A-Za-z_][\w.[\]]*)`/.exec(details);
  return quoted ? quoted[1] : undefined;
}

/** True if the agent's message is a refusal of one of the call's buckets, which it names as `bucket "…"`. */
function namesBucket(details: string, buckets: string[]): boolean {
  return buckets.some((bucket) => details.includes(`bucket "${bucket}"`));
}

function isServiceError(error: unknown): error is grpc.ServiceError {
  return (
    error instanceof Error && typeof (error as Partial<grpc.ServiceError>).code === "number" && "metadata" in error
  );
}

function isAbortSignal(value: unknown): value is AbortSignal {
  return (
    typeof value === "object" &&
    value !== null &&
    typeof (value as AbortSignal).aborted === "boolean" &&
    typeof (value as AbortSignal).addEventListener === "function"
  );
}

function abortReason(signal: AbortSignal): unknown {
  if (signal.reason !== undefined) {
    return signal.reason;
  }
  const error = new Error("This operation was aborted");
  error.name = "AbortError";
  return error;
}

function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) {
    throw abortReason(signal);
  }
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(abortReason(signal as AbortSignal));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
