// daemon.js: a real sluiced for the tests, in its own temp dir under /tmp
// (socket s.sock, config sluice.toml, log), as tests/integration/harness.py
// runs it. SLUICED names the binary. stop() kills it and removes the dir;
// restart() starts a new daemon on the same socket and config.

import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";

const SLUICED = process.env.SLUICED || "build/daemon/sluiced";
const ACCEPT_TIMEOUT_MS = 10_000;
const POLL_INTERVAL_MS = 10;

export class Daemon {
  /** @param {string} rules the [[rule]] tables of the config */
  constructor(rules) {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), "sl-node."));
    this.socket = path.join(this.dir, "s.sock");
    this.config = path.join(this.dir, "sluice.toml");
    this.logPath = path.join(this.dir, "log");
    fs.writeFileSync(this.config, `[daemon]\nsocket = "${this.socket}"\nworkers = 1\n\n${rules}`);
    this.proc = null;
  }

  /** Runs the daemon and resolves once its socket accepts. */
  async start() {
    const log = fs.openSync(this.logPath, "a");
    this.proc = spawn(SLUICED, ["--config", this.config], { stdio: ["ignore", log, log] });
    fs.closeSync(log);
    const proc = this.proc;
    let exited = false;
    proc.once("exit", () => { exited = true; });
    const deadline = Date.now() + ACCEPT_TIMEOUT_MS;
    for (;;) {
      if (await accepts(this.socket)) {
        return;
      }
      if (exited || Date.now() > deadline) {
        throw new Error(`sluiced did not start: ${this.logs()}`);
      }
      await new Promise((resolve) => setTimeout(resolve, POLL_INTERVAL_MS));
    }
  }

  signal(name) {
    this.proc.kill(name);
  }

  /** SIGSTOP, resolving once every thread of the daemon is stopped (a signal
   *  takes effect a moment after kill() returns). */
  async pause() {
    this.proc.kill("SIGSTOP");
    const tasks = `/proc/${this.proc.pid}/task`;
    const deadline = Date.now() + ACCEPT_TIMEOUT_MS;
    // The state is the field after the command, which is in parentheses.
    const stopped = () => fs.readdirSync(tasks).every((tid) =>
      /\) [Tt] /.test(fs.readFileSync(`${tasks}/${tid}/stat`, "utf8")));
    while (!stopped()) {
      if (Date.now() > deadline) {
        throw new Error("sluiced did not stop on SIGSTOP");
      }
      await new Promise((resolve) => setTimeout(resolve, 1));
    }
  }

  /** SIGKILL (which also ends a stopped daemon), then waits for the exit. */
  async kill() {
    const proc = this.proc;
    if (proc === null) {
      return;
    }
    this.proc = null;
    if (proc.exitCode === null && proc.signalCode === null) {
      const exited = new Promise((resolve) => proc.once("exit", resolve));
      proc.kill("SIGKILL");
      await exited;
    }
  }

  async restart() {
    await this.kill();
    fs.rmSync(this.socket, { force: true });
    await this.start();
  }

  async stop() {
    await this.kill();
    fs.rmSync(this.dir, { recursive: true, force: true });
  }

  logs() {
    try {
      return fs.readFileSync(this.logPath, "utf8");
    } catch {
      return "";
    }
  }
}

function accepts(socketPath) {
  return new Promise((resolve) => {
    const s = net.createConnection(socketPath);
    s.once("connect", () => { s.destroy(); resolve(true); });
    s.once("error", () => resolve(false));
  });
}
