package dev.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.concurrent.CompletableFuture;
import org.junit.jupiter.api.Test;

/**
 * Timeouts, the reconnection rule and the unreachable-daemon policy against
 * real daemons that are stopped, killed and restarted.
 */
class FailureTest {
  static final String RULES = String.join("\n",
      "[[rule]]", "name = \"ten\"", "algorithm = \"fixed_window\"", "limit = 10",
      "period = \"1h\"",
      "",
      // One unit per 2 s, waiting up to 5 s: the second acquire is held.
      "[[rule]]", "name = \"slow\"", "algorithm = \"gcra\"", "limit = 1", "period = \"2s\"",
      "pace = true", "max_wait = \"5s\"", "");

  @Test
  void callsToAStoppedDaemonTimeOutAndItsLateAnswersAreDiscarded() throws Exception {
    try (Daemon daemon = new Daemon(RULES).start();
        SluiceClient client = SluiceClient.connect(
            new SluiceClient.Options().socketPath(daemon.socket).timeoutMs(300))) {
      byte[] key = "stop".getBytes(java.nio.charset.StandardCharsets.US_ASCII);
      assertFalse(client.acquire("ten", key, 1, 10_000).unreachable());
      daemon.signal("STOP");
      try {
        long started = System.nanoTime();
        Decision d = client.acquire("ten", "stop");
        long elapsedMs = (System.nanoTime() - started) / 1_000_000;
        assertTrue(d.unreachable(), d + " after " + elapsedMs + " ms");
        assertTrue(d.allowed(), "fail_open is the default");
        assertEquals(ErrorCode.ETIMEDOUT, d.unreachableCause().code());
        assertTrue(elapsedMs >= 290 && elapsedMs < 3000, "timed out after " + elapsedMs + " ms");
        assertEquals(1, client.failedOpenCount());

        SluiceException e = assertThrows(SluiceException.class, () -> client.peek("ten", "stop"));
        assertEquals(ErrorCode.ETIMEDOUT, e.code());
        e = assertThrows(SluiceException.class, client::health);
        assertEquals(ErrorCode.ETIMEDOUT, e.code());
        assertEquals(0, client.inFlight());
      } finally {
        daemon.signal("CONT");
      }
      // The connection is still good: the three late answers come first and
      // are dropped, then this call gets its own.
      Decision after = client.acquire("ten", key, 1, 10_000);
      assertFalse(after.unreachable(), String.valueOf(after.unreachableCause()));
      // The request sent while the daemon was stopped was acted on (its
      // bytes were written), and never sent twice: 1 + 1 + 1 units spent.
      assertEquals(7, after.remaining());
      assertEquals(3, client.staleResponseCount());
      assertEquals(1, client.connectCount());
    }
  }

  @Test
  void callsReturnByTheirTimeoutWhenAStoppedDaemonLeavesTheirWriteUnfinished() throws Exception {
    try (Daemon daemon = new Daemon(RULES).start();
        SluiceClient client = SluiceClient.connect(
            new SluiceClient.Options().socketPath(daemon.socket).timeoutMs(10_000))) {
      assertTrue(client.acquire("ten", "before").allowed());
      daemon.signal("STOP");
      List<CompletableFuture<Decision>> calls = new java.util.ArrayList<>();
      long started = System.nanoTime();
      try {
        // 3,000 requests of 4 KB keys: far more than the socket buffers hold.
        for (int i = 0; i < 3_000; i++) {
          byte[] key = String.format("%04d", i).repeat(1000).getBytes(
              java.nio.charset.StandardCharsets.US_ASCII);
          calls.add(client.acquireAsync("ten", key, 1, 300));
        }
        long submittedMs = (System.nanoTime() - started) / 1_000_000;
        for (CompletableFuture<Decision> call : calls) {
          Decision d = call.join();
          assertTrue(d.unreachable());
          assertEquals(ErrorCode.ETIMEDOUT, d.unreachableCause().code());
        }
        long answeredMs = (System.nanoTime() - started) / 1_000_000;
        assertTrue(submittedMs < 2_000, "submitting took " + submittedMs + " ms");
        assertTrue(answeredMs < 3_000, "timing out took " + answeredMs + " ms");
        assertEquals(0, client.inFlight());
      } finally {
        daemon.signal("CONT");
      }
      // The rest of the requests go out in the background; then calls work again.
      Decision after = client.acquire("ten", "after".getBytes(
          java.nio.charset.StandardCharsets.US_ASCII), 1, 20_000);
      assertFalse(after.unreachable(), String.valueOf(after.unreachableCause()));
      assertEquals(9, after.remaining());
    }
  }

  @Test
  void requestsNotOneByteOfWhichWasWrittenAreSentOnceOnTheNewConnection() throws Exception {
    String rules = RULES + String.join("\n", "[[rule]]", "name = \"big\"",
        "algorithm = \"fixed_window\"", "limit = 1000000", "period = \"1h\"", "");
    try (Daemon daemon = new Daemon(rules).start();
        SluiceClient client = SluiceClient.connect(
            new SluiceClient.Options().socketPath(daemon.socket).timeoutMs(30_000))) {
      assertFalse(client.acquire("big", "warm").unreachable());
      daemon.signal("STOP");
      // 3,000 requests of 4 KB: the socket takes a few hundred KB, the
      // writer thread waits inside a batch, and the rest stay queued.
      int n = 3_000;
      List<CompletableFuture<Decision>> calls = new java.util.ArrayList<>();
      for (int i = 0; i < n; i++) {
        byte[] key = ("k" + "x".repeat(4000)).getBytes(java.nio.charset.StandardCharsets.US_ASCII);
        calls.add(client.acquireAsync("big", key, 1, 30_000));
      }
      Process first = daemon.startReplacement();
      first.destroyForcibly();
      first.waitFor();

      int resent = 0;
      int dropped = 0;
      for (CompletableFuture<Decision> call : calls) {
        Decision d = call.join();
        if (d.unreachable()) {
          assertEquals(ErrorCode.ECLOSED, d.unreachableCause().code());
          dropped++;
        } else {
          resent++;
        }
      }
      assertTrue(dropped > 0, "requests written to the first daemon fail");
      assertTrue(resent > 0, "requests never written go to the second daemon");
      // The second daemon saw each re-sent request exactly once.
      byte[] key = ("k" + "x".repeat(4000)).getBytes(java.nio.charset.StandardCharsets.US_ASCII);
      assertEquals(1_000_000 - resent, client.peekAsync("big", key, 10_000).join().remaining());
      assertEquals(2, client.connectCount());
    }
  }

  @Test
  void aRestartedDaemonIsReconnectedToAtTheNextCall() throws Exception {
    try (Daemon daemon = new Daemon(RULES).start();
        SluiceClient client = SluiceClient.connect(
            new SluiceClient.Options().socketPath(daemon.socket).timeoutMs(10_000))) {
      assertEquals(9, client.acquire("ten", "restart").remaining());
      daemon.stop();
      daemon.start();
      Decision d = client.acquire("ten", "restart");
      assertFalse(d.unreachable(), String.valueOf(d.unreachableCause()));
      // The new daemon saw this request once.
      assertEquals(9, d.remaining());
      assertEquals(2, client.connectCount());
      assertEquals(0, client.failedOpenCount());
    }
  }

  @Test
  void aRequestInFlightWhenTheDaemonDiesFailsAndIsNeverSentAgain() throws Exception {
    try (Daemon daemon = new Daemon(RULES).start();
        SluiceClient client = SluiceClient.connect(
            new SluiceClient.Options().socketPath(daemon.socket).timeoutMs(10_000))) {
      assertTrue(client.acquire("slow", "held").allowed());
      CompletableFuture<Decision> held = client.acquireAsync("slow", "held");
      CompletableFuture<Health> plain = client.healthAsync(10_000);
      plain.join(); // answered at once: the held acquire was written before it
      assertFalse(held.isDone(), "the daemon holds the second acquire");
      assertEquals(1, client.inFlight());

      daemon.stop();
      Decision d = held.join();
      assertTrue(d.unreachable());
      assertEquals(ErrorCode.ECLOSED, d.unreachableCause().code());
      assertEquals(0, client.inFlight());

      daemon.start();
      // A fresh daemon: had the held acquire been sent again, it would have
      // spent the key's one unit.
      assertEquals(1, client.peek("slow", "held").remaining());
      assertEquals(2, client.connectCount());
    }
  }

  @Test
  void aCallWhoseAnswerIsCutOffByTheConnectionClosingFailsWithIt() throws Exception {
    // A stand-in daemon answers the first request (msgid 7) with half a
    // frame, up to the first key of the decision map, and closes.
    java.nio.file.Path dir = java.nio.file.Files.createTempDirectory("sluice-cut");
    java.nio.file.Path socket = dir.resolve("d.sock");
    try (java.nio.channels.ServerSocketChannel server = java.nio.channels.ServerSocketChannel.open(
        java.net.StandardProtocolFamily.UNIX)) {
      server.bind(java.net.UnixDomainSocketAddress.of(socket));
      Thread daemon = new Thread(() -> {
        try (java.nio.channels.SocketChannel ch = server.accept()) {
          ch.read(java.nio.ByteBuffer.allocate(4096));
          byte[] half = {(byte) 0x94, 0x01, 0x07, (byte) 0xc0, (byte) 0x82, (byte) 0xa7,
              'a', 'l', 'l', 'o', 'w', 'e', 'd'};
          ch.write(java.nio.ByteBuffer.wrap(half));
        } catch (java.io.IOException e) {
          throw new java.io.UncheckedIOException(e);
        }
      });
      daemon.start();
      try (SluiceClient client = new SluiceClient(new SluiceClient.Options()
          .socketPath(socket.toString()).timeoutMs(-1).firstMsgid(7))) {
        // No timeout: only the connection's end can answer the call.
        CompletableFuture<Decision> cut = client.peekAsync("r", new byte[] {'k'}, -1);
        java.util.concurrent.ExecutionException e = assertThrows(
            java.util.concurrent.ExecutionException.class,
            () -> cut.get(10, java.util.concurrent.TimeUnit.SECONDS));
        assertEquals(ErrorCode.ECLOSED, ((SluiceException) e.getCause()).code());
        assertEquals(0, client.inFlight());
      }
      daemon.join();
    } finally {
      java.nio.file.Files.deleteIfExists(socket);
      java.nio.file.Files.delete(dir);
    }
  }

  @Test
  void anUnreachableDaemonFailsOpenByDefaultAndIsCounted() throws Exception {
    try (Daemon daemon = new Daemon(RULES)) {
      assertEquals(ErrorCode.ECONNECT,
          assertThrows(SluiceException.class, () -> SluiceClient.connect(daemon.socket)).code());
      try (SluiceClient client = new SluiceClient(
          new SluiceClient.Options().socketPath(daemon.socket).timeoutMs(10_000))) {
        Decision d = client.acquire("ten", "k");
        assertTrue(d.allowed());
        assertTrue(d.unreachable());
        assertEquals(ErrorCode.ECONNECT, d.unreachableCause().code());
        AcquireAllResult all = client.acquireAll(List.of(new Item("ten", "a", 1),
            new Item("ten", "b", 1)));
        assertTrue(all.allowed());
        assertEquals(2, all.results().size());
        assertEquals(2, client.failedOpenCount());
        assertEquals(0, client.failedClosedCount());
        // Only acquire and acquireAll decide by policy; the rest report the error.
        assertEquals(ErrorCode.ECONNECT,
            assertThrows(SluiceException.class, client::health).code());
        assertEquals(ErrorCode.ECONNECT,
            assertThrows(SluiceException.class, () -> client.peek("ten", "k")).code());

        // Once the daemon is there, the next call connects.
        daemon.start();
        Decision real = client.acquire("ten", "k");
        assertFalse(real.unreachable());
        assertEquals(9, real.remaining());
        assertEquals(2, client.failedOpenCount());
      }
    }
  }

  @Test
  void failClosedDeniesWithARetryAfterOneSecondAndIsCounted() throws Exception {
    try (Daemon daemon = new Daemon(RULES);
        SluiceClient client = new SluiceClient(new SluiceClient.Options()
            .socketPath(daemon.socket).unreachablePolicy(UnreachablePolicy.FAIL_CLOSED))) {
      Decision d = client.acquire("ten", "k");
      assertFalse(d.allowed());
      assertTrue(d.unreachable());
      assertEquals(1000, d.retryAfterMs());
      assertFalse(client.acquireAll(List.of(new Item("ten", "a", 1))).allowed());
      assertEquals(2, client.failedClosedCount());
      assertEquals(0, client.failedOpenCount());
    }
  }

  @Test
  void reserveFollowsThePolicyWithNoIdAndItsSettleAsksNothing() throws Exception {
    try (Daemon daemon = new Daemon(RULES);
        SluiceClient open = new SluiceClient(new SluiceClient.Options().socketPath(daemon.socket));
        SluiceClient closed = new SluiceClient(new SluiceClient.Options()
            .socketPath(daemon.socket).unreachablePolicy(UnreachablePolicy.FAIL_CLOSED))) {
      Reservation r = open.reserve("ten", "k", 5);
      assertTrue(r.allowed());
      assertTrue(r.decision().unreachable());
      assertEquals(0, r.id());
      assertEquals(ErrorCode.ECONNECT, r.decision().unreachableCause().code());
      assertEquals(0, open.settle(r.id(), 9).debt());
      assertEquals(0, open.cancel(r.id()).refunded());
      assertEquals(1, open.failedOpenCount());
      assertEquals(ErrorCode.ECONNECT,
          assertThrows(SluiceException.class, () -> open.settle(42, 1)).code());
      Reservation denied = closed.reserve("ten", "k", 5);
      assertFalse(denied.allowed());
      assertEquals(0, denied.id());
      assertEquals(1, closed.failedClosedCount());
    }
  }

  static List<Thread> sluiceThreads() {
    List<Thread> threads = new java.util.ArrayList<>();
    for (Thread t : Thread.getAllStackTraces().keySet()) {
      if (t.getName().startsWith("sluice-")) {
        threads.add(t);
      }
    }
    return threads;
  }

  @Test
  void closeEndsEveryThreadOfTheClientAcrossReconnections() throws Exception {
    List<Thread> before = sluiceThreads();
    try (Daemon daemon = new Daemon(RULES).start()) {
      SluiceClient client = SluiceClient.connect(
          new SluiceClient.Options().socketPath(daemon.socket).timeoutMs(10_000));
      assertTrue(client.acquire("ten", "threads").allowed());
      daemon.stop();
      daemon.start();
      assertTrue(client.acquire("ten", "threads").allowed());
      assertEquals(2, client.connectCount());
      List<Thread> mine = sluiceThreads();
      mine.removeAll(before);
      // The timer thread and at least the live connection's reader.
      assertTrue(mine.size() >= 2, mine.toString());
      client.close();
      for (Thread t : mine) {
        t.join(10_000);
        assertFalse(t.isAlive(), t + " still runs");
      }
    }
  }

  @Test
  void aClosedClientRefusesCalls() throws Exception {
    try (Daemon daemon = new Daemon(RULES).start()) {
      SluiceClient client = SluiceClient.connect(daemon.socket);
      client.close();
      client.close();
      assertEquals(ErrorCode.EINVAL,
          assertThrows(SluiceException.class, () -> client.acquire("ten", "k")).code());
    }
  }
}
