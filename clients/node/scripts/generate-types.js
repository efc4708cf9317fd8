// Regenerates `src/generated/` from the package's protos with
// `proto-loader-gen-types`. `generate` is also what the freshness test runs,
// on a fresh copy of the repository's protos, to compare with what is
// committed.
"use strict";

const { execFileSync } = require("node:child_process");
const fs = require("node:fs");
const path = require("node:path");
const { PACKAGE_DIR, GENERATED_DIR, ROOT_PROTO, LOADER_FLAGS } = require("./protos.js");

/**
 * Writes into `outDir` the types of the protos in `baseDir/proto`. The
 * generator names each type's proto file in a comment, relative to the
 * directory it runs in: running in `baseDir` keeps that comment the same
 * wherever `baseDir` is.
 */
function generate(baseDir, outDir) {
  fs.rmSync(outDir, { recursive: true, force: true });
  fs.mkdirSync(outDir, { recursive: true });
  const bin = require.resolve("@grpc/proto-loader/build/bin/proto-loader-gen-types.js", {
    paths: [PACKAGE_DIR],
  });
  // The file name comes first: `--includeDirs` takes every argument after it.
  execFileSync(process.execPath, [bin, ROOT_PROTO, ...LOADER_FLAGS, `--outDir=${outDir}`, "--includeDirs=proto"], {
    cwd: baseDir,
    stdio: ["ignore", "ignore", "inherit"],
  });
}

module.exports = { generate };

if (require.main === module) {
  generate(PACKAGE_DIR, GENERATED_DIR);
  console.log(`wrote ${path.relative(PACKAGE_DIR, GENERATED_DIR)}/`);
}
