// The committed types in src/generated/ are what `proto-loader-gen-types`
// makes of the repository's protos today: `npm run generate` rewrites them
// when a proto changes, and this test fails until it has been run.

import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";

const PACKAGE_DIR = path.resolve(__dirname, "..", "..");

interface ProtosModule {
  REPO_PROTO_DIR: string;
  GENERATED_DIR: string;
  copyProtos(fromDir: string, toDir: string): void;
}
interface GenerateModule {
  generate(baseDir: string, outDir: string): void;
}

const protos = require(path.join(PACKAGE_DIR, "scripts", "protos.js")) as ProtosModule;
const { generate } = require(path.join(PACKAGE_DIR, "scripts", "generate-types.js")) as GenerateModule;

function files(dir: string, under = ""): Map<string, string> {
  const found = new Map<string, string>();
  for (const entry of fs.readdirSync(path.join(dir, under), { withFileTypes: true })) {
    const name = path.posix.join(under, entry.name);
    if (entry.isDirectory()) {
      for (const [file, text] of files(dir, name)) found.set(file, text);
    } else {
      found.set(name, fs.readFileSync(path.join(dir, name), "utf8"));
    }
  }
  return found;
}

test("the committed generated types match the repository's protos", () => {
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "tollgate-node-generated-"));
  try {
    protos.copyProtos(protos.REPO_PROTO_DIR, path.join(scratch, "proto"));
    generate(scratch, path.join(scratch, "generated"));
    const fresh = files(path.join(scratch, "generated"));
    const committed = files(protos.GENERATED_DIR);
    assert.ok(fresh.size > 0, "the generator wrote nothing");
    assert.deepEqual(
      [...committed.keys()].sort(),
      [...fresh.keys()].sort(),
      "src/generated/ has other files than the protos give: run `npm run generate`",
    );
    for (const [file, text] of fresh) {
      assert.equal(committed.get(file), text, `src/generated/${file} is stale: run \`npm run generate\``);
    }
  } finally {
    fs.rmSync(scratch, { recursive: true, force: true });
  }
});
