// Where the package's protos come from, shared by the copy and generation
// scripts and the test that keeps the generated types fresh.
//
// The repository's `proto/` directory is the one source of the agent's wire
// API; the package carries a copy (made at build time, never edited) so that
// it loads the same definitions when installed outside the repository.
"use strict";

const fs = require("node:fs");
const path = require("node:path");

const PACKAGE_DIR = path.resolve(__dirname, "..");
const REPO_PROTO_DIR = path.resolve(PACKAGE_DIR, "..", "..", "proto");
const PACKAGE_PROTO_DIR = path.join(PACKAGE_DIR, "proto");
const GENERATED_DIR = path.join(PACKAGE_DIR, "src", "generated");
const ROOT_PROTO = "tollgate/agent/v1/agent.proto";

// The options of both `proto-loader-gen-types` and `loadSync`: the types
// describe the objects the loader makes only if the two agree.
// `src/loader.ts` passes the same options to `loadSync`.
const LOADER_FLAGS = ["--longs=String", "--enums=String", "--defaults", "--oneofs", "--grpcLib=@grpc/grpc-js"];

/**
 * The root proto and every proto it imports, transitively, that lives under
 * `protoDir` (the well-known `google/protobuf/*` types come with protobufjs).
 */
function protoClosure(protoDir) {
  const seen = new Set();
  const pending = [ROOT_PROTO];
  while (pending.length > 0) {
    const name = pending.pop();
    if (seen.has(name)) continue;
    const file = path.join(protoDir, name);
    if (!fs.existsSync(file)) {
      if (name.startsWith("google/protobuf/")) continue;
      throw new Error(`${file}: imported proto not found`);
    }
    seen.add(name);
    const text = fs.readFileSync(file, "utf8");
    for (const match of text.matchAll(/^\s*import\s+(?:public\s+|weak\s+)?"([^"]+)"\s*;/gm)) {
      pending.push(match[1]);
    }
  }
  return [...seen].sort();
}

/** Copies the protos `protoClosure` finds under `fromDir` into `toDir`. */
function copyProtos(fromDir, toDir) {
  for (const name of protoClosure(fromDir)) {
    const target = path.join(toDir, name);
    fs.mkdirSync(path.dirname(target), { recursive: true });
    fs.copyFileSync(path.join(fromDir, name), target);
  }
}

module.exports = {
  PACKAGE_DIR,
  REPO_PROTO_DIR,
  PACKAGE_PROTO_DIR,
  GENERATED_DIR,
  ROOT_PROTO,
  LOADER_FLAGS,
  protoClosure,
  copyProtos,
};
