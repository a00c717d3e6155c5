package dev.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Many calls in flight on one connection: matching by msgid, wraparound, threads. */
class PipelineTest {
  static final long BIG = 1_000_000;
  static final String RULES = String.join("\n",
      "[[rule]]", "name = \"big\"", "algorithm = \"fixed_window\"", "limit = " + BIG,
      "period = \"1h\"",
      "",
      // One unit per 10 ms, waiting up to 5 s: 100 waiters on one key are
      // answered over about a second, after the requests sent behind them.
      "[[rule]]", "name = \"held\"", "algorithm = \"gcra\"", "limit = 100", "period = \"1s\"",
      "pace = true", "max_wait = \"5s\"", "",
      // One unit per 4 s: a second acquire of a key waits about 4 s.
      "[[rule]]", "name = \"slow\"", "algorithm = \"gcra\"", "limit = 1", "period = \"4s\"",
      "pace = true", "max_wait = \"5s\"", "");

  static Daemon daemon;

  @BeforeAll
  static void startDaemon() throws Exception {
    daemon = new Daemon(RULES).start();
  }

  @AfterAll
  static void stopDaemon() throws Exception {
    daemon.close();
  }

  static long costOf(int i) {
    return i % 50 + 1;
  }

  @Test
  void tenThousandPipelinedCallsAreEachMatchedToTheirOwnAnswerOutOfOrder() {
    try (SluiceClient client = new SluiceClient(
        new SluiceClient.Options().socketPath(daemon.socket).timeoutMs(20_000))) {
      int n = 10_000;
      AtomicInteger answered = new AtomicInteger();
      int[] order = new int[n];
      List<CompletableFuture<Decision>> calls = new ArrayList<>(n);
      for (int i = 0; i < n; i++) {
        final int index = i;
        CompletableFuture<Decision> call = i % 100 == 0
            ? client.acquireAsync("held", "one-key")
            : client.acquireAsync("big", "p" + i, costOf(i));
        calls.add(call.whenComplete((d, e) -> order[index] = answered.incrementAndGet()));
      }
      int held = 0;
      long longestWaitMs = 0;
      for (int i = 0; i < n; i++) {
        Decision d = calls.get(i).join();
        assertTrue(d.allowed(), "call " + i);
        assertFalse(d.unreachable(), "call " + i);
        if (i % 100 == 0) {
          held++;
          longestWaitMs = Math.max(longestWaitMs, d.waitedMs());
        } else {
          // Each key is new: its answer shows exactly its own cost.
          assertEquals(BIG - costOf(i), d.remaining(), "call " + i);
        }
      }
      assertEquals(100, held);
      assertTrue(longestWaitMs >= 200, "the last waiter waited " + longestWaitMs + " ms");
      // The last waiter was sent before 99 others yet answered after them.
      int overtaken = 0;
      for (int i = 9_901; i < n; i++) {
        if (order[i] < order[9_900]) {
          overtaken++;
        }
      }
      assertTrue(overtaken > 0, "no answer came out of order");
      assertEquals(0, client.inFlight());
      assertEquals(1, client.connectCount());
    }
  }

  @Test
  void aCallWaitingWhileMsgidsRunFarAheadIsStillAnsweredAsItself() {
    // The waiting call's msgid is 2^32 - 1000; the others run 100,000 past
    // it (over the wrap), further than the table of calls in flight reaches.
    long first = (1L << 32) - 1000;
    try (SluiceClient client = SluiceClient.connect(
        new SluiceClient.Options().socketPath(daemon.socket).timeoutMs(20_000).firstMsgid(first))) {
      assertTrue(client.acquire("slow", "far").allowed());
      CompletableFuture<Decision> waiting = client.acquireAsync("slow", "far");
      // In rounds of 5,000 in flight: the daemon closes a connection whose
      // unread answers pass max_output_bytes.
      int n = 100_000;
      int round = 5_000;
      List<CompletableFuture<Decision>> calls = new ArrayList<>(round);
      for (int from = 0; from < n; from += round) {
        calls.clear();
        for (int i = from; i < from + round; i++) {
          calls.add(client.acquireAsync("big", "far" + i, costOf(i)));
        }
        for (int i = from; i < from + round; i++) {
          Decision d = calls.get(i - from).join();
          assertEquals(BIG - costOf(i), d.remaining(), "call " + i + ": " + d);
        }
      }
      assertFalse(waiting.isDone(), "the waiting call was answered before the others ran past it");
      Decision d = waiting.join();
      assertTrue(d.allowed());
      assertTrue(d.waitedMs() >= 1000, "it waited " + d.waitedMs() + " ms");
      assertEquals(0, client.inFlight());
      assertEquals(0, client.staleResponseCount());
    }
  }

  @Test
  void msgidsWrapFrom2To32Minus1ToZeroAndAnswersStillMatch() {
    long first = (1L << 32) - 5;
    try (SluiceClient client = new SluiceClient(
        new SluiceClient.Options().socketPath(daemon.socket).timeoutMs(10_000).firstMsgid(first))) {
      assertEquals(first, client.nextMsgid());
      List<CompletableFuture<Decision>> calls = new ArrayList<>();
      for (int i = 0; i < 20; i++) {
        calls.add(client.acquireAsync("big", "wrap" + i, i + 1));
      }
      // 4294967291 .. 4294967295, then 0 .. 14.
      assertEquals(15, client.nextMsgid());
      for (int i = 0; i < 20; i++) {
        assertEquals(BIG - (i + 1), calls.get(i).join().remaining(), "call " + i);
      }
      assertEquals(BIG - 1 - 1, client.acquire("big", "wrap0").remaining());
      assertEquals(16, client.nextMsgid());
    }
  }

  @Test
  void callsChainedFromCallbacksOnTheReaderThreadAreAllAnswered() {
    try (SluiceClient client = SluiceClient.connect(
        new SluiceClient.Options().socketPath(daemon.socket).timeoutMs(-1))) {
      // Each call is made in the callback of the one before: 500 in a row,
      // each with 20 more sent alongside, all from the reader thread.
      List<CompletableFuture<Decision>> side = java.util.Collections.synchronizedList(
          new ArrayList<>());
      CompletableFuture<Decision> chain = client.acquireAsync("big", "chain");
      for (int i = 0; i < 500; i++) {
        chain = chain.thenCompose(d -> {
          for (int j = 0; j < 20; j++) {
            side.add(client.acquireAsync("big", "side"));
          }
          return client.acquireAsync("big", "chain");
        });
      }
      assertEquals(BIG - 501, chain.orTimeout(60, java.util.concurrent.TimeUnit.SECONDS)
          .join().remaining());
      CompletableFuture.allOf(side.toArray(new CompletableFuture<?>[0])).join();
      assertEquals(BIG - 10_000, client.peek("big", "side").remaining());
      assertEquals(1, client.connectCount());
    }
  }

  @Test
  void threadsShareOneClientAndEveryCallCounts() throws Exception {
    try (SluiceClient client = SluiceClient.connect(
        new SluiceClient.Options().socketPath(daemon.socket).timeoutMs(10_000))) {
      int threads = 8;
      int each = 250;
      List<Thread> workers = new ArrayList<>();
      AtomicInteger allowed = new AtomicInteger();
      List<Throwable> failures = java.util.Collections.synchronizedList(new ArrayList<>());
      for (int t = 0; t < threads; t++) {
        final int id = t;
        Thread worker = new Thread(() -> {
          try {
            for (int i = 0; i < each; i++) {
              Decision shared = client.acquire("big", "shared");
              Decision own = client.acquire("big", "own" + id, 2);
              if (shared.allowed() && own.allowed() && own.remaining() == BIG - 2L * (i + 1)) {
                allowed.incrementAndGet();
              }
            }
          } catch (Throwable e) {
            failures.add(e);
          }
        });
        workers.add(worker);
        worker.start();
      }
      for (Thread worker : workers) {
        worker.join();
      }
      assertEquals(List.of(), failures);
      assertEquals(threads * each, allowed.get());
      assertEquals(BIG - threads * each, client.peek("big", "shared").remaining());
      assertEquals(1, client.connectCount());
    }
  }
}
