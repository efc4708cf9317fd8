// Every TypeScript example of README.md, type-checked against the built
// package and run against a real agent, as a reader would paste it. Only
// the socket's path and the tenant are this test's: each example runs as
// a tenant of its own on the README's tier, so that it finds the buckets
// as a reader's first run would, whatever the examples before it took.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";
import * as ts from "typescript";

import { Agent, Scratch, Server } from "./harness";

const PACKAGE_DIR = path.resolve(__dirname, "..", "..");
// Inside the package, so that `@tollgate/agent` resolves to it.
const EXAMPLES_DIR = path.join(PACKAGE_DIR, "build", "readme");

/** The README's ```ts blocks, in order. */
function examples(): string[] {
  const readme = fs.readFileSync(path.join(PACKAGE_DIR, "README.md"), "utf8");
  return [...readme.matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((match) => match[1]);
}

/** Compiles the examples as the package's users would, failing on any type error. */
function compile(files: string[]): void {
  const options: ts.CompilerOptions = {
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.Node16,
    moduleResolution: ts.ModuleResolutionKind.Node16,
    lib: ["lib.es2022.d.ts"],
    types: ["node"],
    strict: true,
    outDir: EXAMPLES_DIR,
    rootDir: EXAMPLES_DIR,
  };
  const program = ts.createProgram(files, options);
  const emitted = program.emit();
  const diagnostics = [...ts.getPreEmitDiagnostics(program), ...emitted.diagnostics];
  const host: ts.FormatDiagnosticsHost = {
    getCanonicalFileName: (name) => name,
    getCurrentDirectory: () => PACKAGE_DIR,
    getNewLine: () => "\n",
  };
  assert.equal(diagnostics.length, 0, ts.formatDiagnostics(diagnostics, host));
}

function run(file: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [file], { timeout: 60_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? (typeof error.code === "number" ? error.code : null) : 0, stdout, stderr });
    });
  });
}

function tenantOf(example: number): string {
  return `t1234-${example + 1}`;
}

describe("README examples", () => {
  let scratch: Scratch;
  let agent: Agent;
  const blocks = examples();

  before(async () => {
    scratch = new Scratch("readme");
    const server = await Server.start(scratch);
    const tiers = path.join(scratch.dir, "tiers.toml");
    fs.writeFileSync(
      tiers,
      [
        "[tiers.pro.buckets.schedule-email]",
        "refill_rate = 10",
        "burst_limit = 100",
        "[tiers.pro.buckets.api-calls-per-user]",
        'kind = "per-key"',
        "refill_rate = 5",
        "burst_limit = 50",
        "",
      ].join("\n"),
    );
    await server.cli(["tier", "apply", "-f", tiers, "--yes"]);
    for (let i = 0; i < blocks.length; i++) {
      await server.cli(["tenant", "create", "--tenant", tenantOf(i), "--tier", "pro"]);
    }
    agent = await Agent.start(scratch, server);
  });
  after(async () => {
    await scratch.close();
  });

  it("has examples, and they type-check against the package", () => {
    assert.ok(blocks.length >= 5, `${blocks.length} examples`);
    fs.rmSync(EXAMPLES_DIR, { recursive: true, force: true });
    fs.mkdirSync(EXAMPLES_DIR, { recursive: true });
    const files = blocks.map((block, i) => {
      const file = path.join(EXAMPLES_DIR, `example-${i + 1}.ts`);
      fs.writeFileSync(
        file,
        block.replaceAll("/run/tollgate/agent.sock", agent.socket).replaceAll('"t1234"', JSON.stringify(tenantOf(i))),
      );
      return file;
    });
    compile(files);
  });

  for (let i = 0; i < blocks.length; i++) {
    it(`example ${i + 1} runs to its end`, async (t) => {
      const { code, stdout, stderr } = await run(path.join(EXAMPLES_DIR, `example-${i + 1}.js`));
      assert.equal(code, 0, `example ${i + 1} failed:\n${blocks[i]}\n--- stdout\n${stdout}--- stderr\n${stderr}`);
      assert.equal(stderr, "", `example ${i + 1} wrote to stderr`);
      assert.notEqual(stdout.trim(), "", `example ${i + 1} printed nothing`);
      t.diagnostic(stdout.trim());
    });
  }
});
