/**
 * Real processes for the tests: a `tollgate serve` on an embedded store in a
 * scratch directory, `tollgate agent`s in front of it, the `tollgate` CLI to
 * configure tenants and read the server's totals, and a TCP relay that can
 * lose an answer on the way back.
 *
 * The binary is `$TOLLGATE_BIN` (`test.sh` sets it). Every process a test
 * starts is stopped by `Scratch.close()`, and its log is kept in the
 * scratch directory and quoted when it fails to start.
 */

import { ChildProcess, execFile, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { setTimeout as delay } from "node:timers/promises";

export function tollgateBin(): string {
  const bin = process.env.TOLLGATE_BIN;
  if (!bin) {
    throw new Error("TOLLGATE_BIN is not set: the tests need the tollgate binary (test.sh builds it)");
  }
  if (!fs.existsSync(bin)) {
    throw new Error(`TOLLGATE_BIN=${bin}: no such file`);
  }
  return path.resolve(bin);
}

/** A scratch directory and the processes started in it. */
export class Scratch {
  readonly dir: string;
  private readonly processes = new Set<ChildProcess>();
  private readonly closers: Array<() => Promise<void> | void> = [];

  constructor(name: string) {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), `tollgate-node-${name}-`));
    // A test process that dies without closing its scratch leaves no server
    // or agent behind.
    process.once("exit", () => {
      for (const child of this.processes) child.kill("SIGKILL");
    });
  }

  spawn(args: string[], logName: string): { child: ChildProcess; log: string } {
    const log = path.join(this.dir, `${logName}.log`);
    const out = fs.openSync(log, "a");
    const child = spawn(tollgateBin(), args, {
      stdio: ["ignore", out, out],
      env: { ...process.env, RUST_LOG: "info" },
    });
    fs.closeSync(out);
    this.processes.add(child);
    child.once("exit", () => this.processes.delete(child));
    return { child, log };
  }

  onClose(closer: () => Promise<void> | void): void {
    this.closers.push(closer);
  }

  async close(): Promise<void> {
    for (const closer of this.closers.splice(0).reverse()) {
      await closer();
    }
    await Promise.all([...this.processes].map((child) => stopProcess(child, "SIGKILL")));
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

/** Sends `signal` and waits for the process to exit; resolves with its exit code (null if killed). */
export function stopProcess(child: ChildProcess, signal: NodeJS.Signals): Promise<number | null> {
  if (child.exitCode !== null || child.signalCode !== null) {
    return Promise.resolve(child.exitCode);
  }
  return new Promise((resolve) => {
    child.once("exit", (code) => resolve(code));
    child.kill(signal);
  });
}

function tail(log: string): string {
  try {
    return fs.readFileSync(log, "utf8").split("\n").slice(-30).join("\n");
  } catch {
    return "(no log)";
  }
}

/** Waits until `ready()` is true, failing with the process's log if it exits or takes longer than `timeoutMs`. */
async function waitReady(
  what: string,
  child: ChildProcess,
  log: string,
  ready: () => Promise<boolean>,
  timeoutMs = 30_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(`${what} exited (${child.exitCode ?? child.signalCode}) before it was ready:\n${tail(log)}`);
    }
    if (await ready()) {
      return;
    }
    if (Date.now() > deadline) {
      throw new Error(`${what} not ready after ${timeoutMs} ms:\n${tail(log)}`);
    }
    await delay(50);
  }
}

function connects(options: net.NetConnectOpts): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(options);
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

/** A loopback port nobody listens on now. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** `tollgate serve` on an embedded store in the scratch directory. */
export class Server {
  private constructor(
    readonly url: string,
    private readonly child: ChildProcess,
  ) {}

  static async start(scratch: Scratch): Promise<Server> {
    const store = path.join(scratch.dir, "tollgate.redb");
    // The port is read back from the log, so that two test files never race for one.
    const { child, log } = scratch.spawn(
      [
        "serve",
        "--store",
        store,
        "--create",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "off",
        "--log-format",
        "json",
      ],
      "server",
    );
    let address: string | undefined;
    await waitReady("tollgate serve", child, log, async () => {
      address = listeningAddress(log);
      return address !== undefined;
    });
    return new Server(`http://${address}`, child);
  }

  /** Runs a `tollgate` client command against this server; resolves with its stdout. */
  cli(args: string[]): Promise<string> {
    return new Promise((resolve, reject) => {
      execFile(tollgateBin(), [...args, "--server", this.url], { timeout: 30_000 }, (error, stdout, stderr) => {
        if (error) {
          reject(new Error(`tollgate ${args.join(" ")}: ${error.message}\n${stderr}`));
        } else {
          resolve(stdout);
        }
      });
    });
  }

  /** Creates (or sets) a bucket of the tenant: `available` tokens now, `refillRate` per second, capped at `burstLimit`. */
  async setLimits(
    tenant: string,
    bucket: string,
    available: number,
    refillRate: number,
    burstLimit: number,
  ): Promise<void> {
    await this.cli([
      "tenant",
      "set-limits",
      "--tenant",
      tenant,
      "--bucket",
      bucket,
      "--available",
      String(available),
      "--refill-rate",
      String(refillRate),
      "--burst-limit",
      String(burstLimit),
    ]);
  }

  /** The server's record of one bucket: its totals (`consumption`), limits and instances. */
  async bucket(tenant: string, bucket: string): Promise<BucketRecord> {
    const shown: unknown = JSON.parse(
      await this.cli(["tenant", "show", "--tenant", tenant, "--bucket", bucket, "--json"]),
    );
    return (Array.isArray(shown) ? shown[0] : shown) as BucketRecord;
  }

  async stop(): Promise<void> {
    await stopProcess(this.child, "SIGTERM");
  }
}

export interface BucketRecord {
  tenant_id: string;
  bucket: string;
  granted_tokens: number;
  live_instances: number;
  consumption: {
    request_units: number;
    request_unit_micros: number;
    read_requests: number;
    read_bytes: number;
    write_requests: number;
    write_bytes: number;
    cpu_seconds: number;
    cpu_micros: number;
    egress_bytes: number;
  };
}

function listeningAddress(log: string): string | undefined {
  let text: string;
  try {
    text = fs.readFileSync(log, "utf8");
  } catch {
    return undefined;
  }
  for (const line of text.split("\n")) {
    if (!line.startsWith("{")) continue;
    try {
      const event = JSON.parse(line) as { fields?: { message?: string; address?: string } };
      if (event.fields?.message === "tollgate server listening" && event.fields.address) {
        return event.fields.address;
      }
    } catch {
      // A line cut short while the server writes it: read again later.
    }
  }
  return undefined;
}

export interface AgentOptions {
  /** Also listen on this loopback TCP port. */
  listenPort?: number;
  /** The access file's TOML: `[tenants.<id>] token = "…"`. */
  access?: string;
  /** A name of its own in the scratch directory, for a second agent. */
  name?: string;
}

/**
 * `tollgate agent` in front of the server, on a Unix socket in the scratch
 * directory, with its state there too, so that a restart finds it.
 */
export class Agent {
  readonly socket: string;
  readonly address: string | undefined;
  private child: ChildProcess | undefined;
  private readonly args: string[];
  private readonly logName: string;
  private starts = 0;

  private constructor(
    private readonly scratch: Scratch,
    server: Server,
    options: AgentOptions,
  ) {
    const name = options.name ?? "agent";
    this.socket = path.join(scratch.dir, `${name}.sock`);
    this.logName = name;
    this.args = [
      "agent",
      "--server",
      server.url,
      "--socket",
      this.socket,
      "--state-dir",
      path.join(scratch.dir, `${name}-state`),
      // Each agent of a test is a node of its own: its own instance id.
      "--node-name",
      `${path.basename(scratch.dir)}-${name}`,
    ];
    if (options.listenPort !== undefined) {
      this.address = `127.0.0.1:${options.listenPort}`;
      this.args.push("--listen", this.address);
    }
    if (options.access !== undefined) {
      const access = path.join(scratch.dir, `${name}-access.toml`);
      fs.writeFileSync(access, options.access);
      this.args.push("--access", access);
    }
  }

  static async start(scratch: Scratch, server: Server, options: AgentOptions = {}): Promise<Agent> {
    const agent = new Agent(scratch, server, options);
    await agent.restart();
    return agent;
  }

  /** Starts the agent (again, after `stop` or `kill`), and waits until it accepts connections. */
  async restart(): Promise<void> {
    if (this.running) {
      throw new Error("the agent is running");
    }
    this.starts += 1;
    const { child, log } = this.scratch.spawn(this.args, `${this.logName}-${this.starts}`);
    this.child = child;
    await waitReady("tollgate agent", child, log, async () => {
      if (!(await connects({ path: this.socket }))) return false;
      return this.address === undefined || connects({ host: "127.0.0.1", port: Number(this.address.split(":")[1]) });
    });
  }

  get running(): boolean {
    return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Graceful shutdown (SIGTERM): the agent reports every bucket's consumption to the server. Resolves with the exit code. */
  async stop(): Promise<number | null> {
    return this.child ? stopProcess(this.child, "SIGTERM") : null;
  }

  /** SIGKILL: no shutdown at all. */
  async kill(): Promise<void> {
    if (this.child) await stopProcess(this.child, "SIGKILL");
  }
}

/**
 * A TCP relay in front of the agent's TCP listener that can lose answers:
 * after `loseNextAnswer()`, the next request the client sends reaches the
 * agent, but nothing the agent sends back reaches the client, and both
 * connections are then cut, as when an agent's answer is lost on the way.
 */
export class LossyRelay {
  readonly address: string;
  /** How many answers were lost so far. */
  answersLost = 0;
  private losing = false;
  private readonly sockets = new Set<net.Socket>();

  private constructor(
    private readonly server: net.Server,
    port: number,
  ) {
    this.address = `127.0.0.1:${port}`;
  }

  static start(target: string): Promise<LossyRelay> {
    const [host, port] = target.split(":");
    return new Promise((resolve, reject) => {
      let relay: LossyRelay;
      const server = net.createServer((client) => {
        const upstream = net.connect({ host, port: Number(port) });
        relay.track(client);
        relay.track(upstream);
        let cut = false;
        client.on("data", (chunk) => {
          upstream.write(chunk);
          if (relay.losing && !cut) {
            // This chunk carries the request. Drop everything the agent
            // answers from now on, and cut both connections once it has
            // had time to apply the request.
            relay.losing = false;
            relay.answersLost += 1;
            cut = true;
            setTimeout(() => {
              client.destroy();
              upstream.destroy();
            }, 500);
          }
        });
        upstream.on("data", (chunk) => {
          if (!cut) client.write(chunk);
        });
        client.on("close", () => upstream.destroy());
        upstream.on("close", () => client.destroy());
      });
      server.once("error", reject);
      server.listen(0, "127.0.0.1", () => {
        relay = new LossyRelay(server, (server.address() as net.AddressInfo).port);
        resolve(relay);
      });
    });
  }

  loseNextAnswer(): void {
    this.losing = true;
  }

  private track(socket: net.Socket): void {
    this.sockets.add(socket);
    socket.on("close", () => this.sockets.delete(socket));
    socket.on("error", () => socket.destroy());
  }

  close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

/**
 * Starts the agent's bucket and waits until the server has answered its
 * first request: that request reports whatever was taken before it, so
 * tokens taken after it stay unreported until the agent's next request.
 */
export async function started(
  limiter: { status(bucket: string): Promise<unknown> },
  server: Server,
  tenant: string,
  bucket: string,
): Promise<void> {
  await limiter.status(bucket);
  await eventually(async () => {
    const record = await server.bucket(tenant, bucket);
    if (record.live_instances !== 1) {
      throw new Error(`tenant "${tenant}" bucket "${bucket}": ${record.live_instances} live instances`);
    }
  });
}

/** Polls `probe` until it resolves without throwing, or rethrows its last error after `timeoutMs`. */
export async function eventually<T>(probe: () => Promise<T>, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await probe();
    } catch (error) {
      if (Date.now() > deadline) throw error;
    }
    await delay(100);
  }
}

/** Settles to "pending" if `promise` has not settled within `ms`. */
export async function stateAfter(promise: Promise<unknown>, ms: number): Promise<"pending" | "resolved" | "rejected"> {
  const timer = delay(ms, "pending" as const);
  return Promise.race([
    promise.then(
      () => "resolved" as const,
      () => "rejected" as const,
    ),
    timer,
  ]);
}
