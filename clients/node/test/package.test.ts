// The package as npm packs it works outside the repository: it carries its
// compiled code, its type declarations and the protos it loads at run time.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";

const PACKAGE_DIR = path.resolve(__dirname, "..", "..");

test("the packed package loads the agent's protos from its own files", () => {
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "tollgate-node-package-"));
  try {
    // Built already (the tests run after `npm run build`): pack what is there.
    const packed = JSON.parse(
      execFileSync("npm", ["pack", "--ignore-scripts", "--json", "--pack-destination", scratch], {
        cwd: PACKAGE_DIR,
        encoding: "utf8",
      }),
    ) as Array<{ filename: string; files: Array<{ path: string }> }>;
    const files = packed[0].files.map((file) => file.path);
    for (const needed of [
      "dist/index.js",
      "dist/index.d.ts",
      "proto/tollgate/agent/v1/agent.proto",
      "proto/tollgate/v1/key_limits.proto",
    ]) {
      assert.ok(files.includes(needed), `${needed} is not in the package: ${files.join(", ")}`);
    }

    execFileSync("tar", ["-xzf", path.join(scratch, packed[0].filename), "-C", scratch]);
    const unpacked = path.join(scratch, "package");
    // Its dependencies, as an install would put them beside it.
    fs.symlinkSync(path.join(PACKAGE_DIR, "node_modules"), path.join(unpacked, "node_modules"));
    const script = [
      `const { Limiter, PROTO_DIR } = require(${JSON.stringify(unpacked)});`,
      `const limiter = new Limiter({ tenant: "acme", socket: "/nonexistent/agent.sock" });`,
      `limiter.close();`,
      `console.log(PROTO_DIR);`,
    ].join("\n");
    const protoDir = execFileSync(process.execPath, ["-e", script], { cwd: scratch, encoding: "utf8" }).trim();
    assert.equal(fs.realpathSync(protoDir), fs.realpathSync(path.join(unpacked, "proto")));
  } finally {
    fs.rmSync(scratch, { recursive: true, force: true });
  }
});
