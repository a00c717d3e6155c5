package dev.sluice.client;

import java.io.File;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.stream.Stream;

/**
 * A real sluiced for a test, as tests/integration/harness.py's Daemon: its
 * own temp dir under /tmp holding the socket (s.sock), the config
 * (sluice.toml, the given rules after a [daemon] section naming the socket)
 * and the log. SLUICED names the binary. start() returns once the socket
 * accepts; stop() kills it with SIGKILL; close() also removes the dir.
 */
final class Daemon implements AutoCloseable {
  final Path dir;
  final String socket;
  private final Path config;
  private final Path log;
  private Process process;

  Daemon(String rules) throws IOException {
    dir = Files.createTempDirectory(Path.of("/tmp"), "slj.");
    socket = dir.resolve("s.sock").toString();
    config = dir.resolve("sluice.toml");
    log = dir.resolve("log");
    Files.writeString(config,
        "[daemon]\nsocket = \"" + socket + "\"\nworkers = 2\n\n" + rules, StandardCharsets.UTF_8);
  }

  static String sluiced() {
    String path = System.getenv("SLUICED");
    if (path == null || path.isEmpty()) {
      throw new IllegalStateException("SLUICED must name the sluiced binary");
    }
    return path;
  }

  Daemon start() throws IOException, InterruptedException {
    process = new ProcessBuilder(sluiced(), "--config", config.toString())
        .redirectErrorStream(true)
        .redirectOutput(ProcessBuilder.Redirect.appendTo(log.toFile()))
        .start();
    // The socket file appears at bind(), a moment before listen(): wait
    // until a connection is accepted (or the daemon exits).
    long deadline = System.nanoTime() + 10_000_000_000L;
    while (true) {
      try (SocketChannel ch = SocketChannel.open(StandardProtocolFamily.UNIX)) {
        ch.connect(UnixDomainSocketAddress.of(socket));
        return this;
      } catch (IOException e) {
        if (!process.isAlive() || System.nanoTime() > deadline) {
          throw new IOException("sluiced did not start: " + logs(), e);
        }
        Thread.sleep(10);
      }
    }
  }

  /**
   * Starts a second sluiced on the same config and socket path (the file is
   * removed first, so it binds afresh while the first one, stopped or not,
   * keeps its connections) and returns the first one's process, which the
   * caller ends; stop() and close() end the second.
   */
  Process startReplacement() throws IOException, InterruptedException {
    Process first = process;
    Files.delete(Path.of(socket));
    start();
    return first;
  }

  long pid() {
    return process.pid();
  }

  /**
   * Sends signal `name` (e.g. "STOP", "CONT"). kill() returns before the
   * daemon's threads have stopped, so for STOP this waits until
   * /proc/PID/stat says the process is stopped ('T').
   */
  void signal(String name) throws IOException, InterruptedException {
    Process kill = new ProcessBuilder("kill", "-" + name, Long.toString(process.pid())).start();
    if (kill.waitFor() != 0) {
      throw new IOException("kill -" + name + " failed");
    }
    if (!name.equals("STOP")) {
      return;
    }
    Path stat = Path.of("/proc", Long.toString(process.pid()), "stat");
    long deadline = System.nanoTime() + 5_000_000_000L;
    while (true) {
      String text = Files.readString(stat);
      // "pid (comm) state ...": the state follows the last ')'.
      if (text.substring(text.lastIndexOf(')') + 2).startsWith("T")) {
        return;
      }
      if (System.nanoTime() > deadline) {
        throw new IOException("sluiced did not stop: " + text);
      }
      Thread.sleep(1);
    }
  }

  /** SIGKILL (which also ends a stopped process) and reap. */
  void stop() throws InterruptedException {
    if (process != null && process.isAlive()) {
      process.destroyForcibly();
      process.waitFor();
    }
  }

  String logs() {
    try {
      return Files.readString(log);
    } catch (IOException e) {
      return "(no log: " + e + ")";
    }
  }

  @Override
  public void close() throws IOException {
    try {
      stop();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted while stopping sluiced", e);
    }
    try (Stream<Path> paths = Files.walk(dir)) {
      paths.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
    }
  }
}
