/**
 * `@tollgate/agent`: gate a Node service's work on its Tollgate tenant's
 * buckets through the `tollgate agent` running beside it.
 *
 * The agent holds the local token buckets, refills them from the tenant's
 * global buckets and keeps the accounting exact; this package is its thin,
 * typed client (see `Limiter`). The wire types, generated from the agent's
 * protos, are exported under `wire` for callers that want the raw API.
 */

export {
  Limiter,
  DEFAULT_SOCKET,
  DEFAULT_TIMEOUT_MS,
  type LimiterOptions,
  type CallOptions,
  type AcquireOptions,
  type Admission,
  type Usage,
  type BucketStatus,
  type KeyCheck,
  type KeyAnswer,
  type KeyCheckResult,
} from "./limiter";
export {
  TollgateError,
  NotAdmittedError,
  BucketRefusedError,
  InvalidArgumentError,
  UnauthenticatedError,
  PermissionDeniedError,
  AgentUnavailableError,
  type TollgateErrorOptions,
} from "./errors";
export { PROTO_DIR } from "./loader";
export type * as wire from "./generated/agent";
