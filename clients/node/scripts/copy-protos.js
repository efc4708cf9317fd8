// Copies the agent's protos from the repository's `proto/` into the package,
// so that the built package loads them from its own directory.
//
// Outside the repository (an unpacked tarball) there is nothing to copy from:
// the package's copy is then the one it shipped with, and is kept.
"use strict";

const fs = require("node:fs");
const { REPO_PROTO_DIR, PACKAGE_PROTO_DIR, copyProtos } = require("./protos.js");

if (fs.existsSync(REPO_PROTO_DIR)) {
  fs.rmSync(PACKAGE_PROTO_DIR, { recursive: true, force: true });
  copyProtos(REPO_PROTO_DIR, PACKAGE_PROTO_DIR);
} else if (!fs.existsSync(PACKAGE_PROTO_DIR)) {
  throw new Error(`${REPO_PROTO_DIR}: no protos to copy, and the package has none`);
}
