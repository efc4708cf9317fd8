/**
 * Loads the agent's service from the protos the package carries.
 *
 * The protos are read at run time with `@grpc/proto-loader`, with the very
 * options `scripts/protos.js` gives `proto-loader-gen-types`, so that the
 * committed types in `generated/` describe the objects this loader makes
 * (a test fails when they drift from the repository's protos).
 */

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import * as path from "node:path";

import type { ProtoGrpcType } from "./generated/agent";
import type { AgentClient } from "./generated/tollgate/agent/v1/Agent";

/** The package's copy of the repository's `proto/` (made by `scripts/copy-protos.js`). */
export const PROTO_DIR = path.join(__dirname, "..", "proto");

const ROOT_PROTO = "tollgate/agent/v1/agent.proto";

const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: false,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: [PROTO_DIR],
};

export type AgentClientConstructor = new (
  address: string,
  credentials: grpc.ChannelCredentials,
  options?: grpc.ChannelOptions,
) => AgentClient;

let agentClient: AgentClientConstructor | undefined;

/** The generated client class of `tollgate.agent.v1.Agent`, loaded once. */
export function agentClientConstructor(): AgentClientConstructor {
  if (agentClient === undefined) {
    const definition = protoLoader.loadSync(ROOT_PROTO, LOADER_OPTIONS);
    const loaded = grpc.loadPackageDefinition(definition) as unknown as ProtoGrpcType;
    agentClient = loaded.tollgate.agent.v1.Agent;
  }
  return agentClient;
}
