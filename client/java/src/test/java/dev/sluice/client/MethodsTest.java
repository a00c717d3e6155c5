package dev.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Every method of the client against a real sluiced. */
class MethodsTest {
  static final String RULES = String.join("\n",
      "[[rule]]", "name = \"five\"", "algorithm = \"fixed_window\"", "limit = 5", "period = \"1h\"",
      "",
      "[[rule]]", "name = \"two\"", "algorithm = \"fixed_window\"", "limit = 2", "period = \"1h\"",
      "",
      "[[rule]]", "name = \"slots\"", "algorithm = \"concurrency\"", "limit = 2",
      "",
      "[[rule]]", "name = \"paced\"", "algorithm = \"gcra\"", "limit = 20", "period = \"1s\"",
      "pace = true",
      "",
      // A window no test ends (and whose reset time needs 64 bits): for
      // reserve and settle, a refund or a debt shows in the next answer's
      // remaining exactly.
      "[[rule]]", "name = \"budget\"", "algorithm = \"fixed_window\"", "limit = 10",
      "period = \"366d\"",
      "",
      // As budget, and a key owes at most CAPPED_DEBT: a settle's excess
      // past it is unpaid.
      "[[rule]]", "name = \"capped\"", "algorithm = \"fixed_window\"", "limit = 10",
      "period = \"366d\"", "max_debt = 2", "");
  static final long BUDGET = 10;
  static final long CAPPED_DEBT = 2;

  static Daemon daemon;
  static SluiceClient client;

  @BeforeAll
  static void startDaemon() throws Exception {
    daemon = new Daemon(RULES).start();
    client = SluiceClient.connect(
        new SluiceClient.Options().socketPath(daemon.socket).timeoutMs(10_000));
  }

  @AfterAll
  static void stopDaemon() throws Exception {
    client.close();
    daemon.close();
  }

  @Test
  void acquireSpendsUnitsUntilTheLimitThenDeniesWithARetryTime() {
    for (int i = 1; i <= 5; i++) {
      Decision d = client.acquire("five", "acq");
      assertTrue(d.allowed());
      assertEquals(5 - i, d.remaining());
      assertEquals(5, d.limit());
      assertEquals(Mode.LOCAL, d.mode());
      assertEquals(0, d.retryAfterMs());
      assertFalse(d.unreachable());
    }
    Decision denied = client.acquire("five", "acq");
    assertFalse(denied.allowed());
    assertEquals(0, denied.remaining());
    assertTrue(denied.retryAfterMs() > 0 && denied.retryAfterMs() <= 3_600_000,
        "retry after " + denied.retryAfterMs());
  }

  @Test
  void acquireWithACostSpendsThatManyUnits() {
    assertEquals(2, client.acquire("five", "cost", 3).remaining());
    Decision over = client.acquire("five", "cost", 3);
    assertFalse(over.allowed());
    assertEquals(2, client.peek("five", "cost").remaining());
  }

  @Test
  void aKeyOfBytesThatAreNotUtf8IsItsOwnKey() {
    byte[] binary = {(byte) 0xff, 0, (byte) 0xfe};
    assertEquals(4, client.acquire("five", binary, 1, 1000).remaining());
    assertEquals(3, client.acquire("five", binary, 1, 1000).remaining());
    assertEquals(3, client.peekAsync("five", binary, 1000).join().remaining());
    // The same bytes with the invalid ones replaced are another key.
    assertEquals(5, client.peek("five", new String(binary, java.nio.charset.StandardCharsets.UTF_8))
        .remaining());
  }

  @Test
  void aStringKeyIsTheSameKeyAsItsUtf8Bytes() {
    String key = "caf\u00e9 \u20ac \ud83d\ude00";
    assertEquals(4, client.acquire("five", key).remaining());
    byte[] bytes = key.getBytes(java.nio.charset.StandardCharsets.UTF_8);
    assertEquals(3, client.acquire("five", bytes, 1, 10_000).remaining());
    assertEquals(3, client.peek("five", key).remaining());
  }

  @Test
  void peekReportsTheStateAndSpendsNothing() {
    client.acquire("five", "peek", 2);
    for (int i = 0; i < 3; i++) {
      Decision d = client.peek("five", "peek");
      assertTrue(d.allowed());
      assertEquals(3, d.remaining());
    }
  }

  @Test
  void acquireAllIsAllOrNothing() {
    AcquireAllResult ok = client.acquireAll(List.of(new Item("five", "all-a", 1),
        new Item("two", "all-b", 2)));
    assertTrue(ok.allowed());
    assertEquals(2, ok.results().size());
    assertEquals(4, ok.results().get(0).remaining());
    assertEquals(0, ok.results().get(1).remaining());

    AcquireAllResult denied = client.acquireAll(List.of(new Item("five", "all-a", 1),
        new Item("two", "all-b", 1)));
    assertFalse(denied.allowed());
    assertTrue(denied.results().get(0).allowed());
    assertFalse(denied.results().get(1).allowed());
    // A denial spends nothing anywhere: all-a still has 4.
    assertEquals(4, client.peek("five", "all-a").remaining());
  }

  @Test
  void releaseGivesAConcurrencyUnitBack() {
    assertTrue(client.acquire("slots", "job").allowed());
    assertTrue(client.acquire("slots", "job").allowed());
    assertFalse(client.acquire("slots", "job").allowed());
    Decision released = client.release("slots", "job", 1);
    assertTrue(released.allowed());
    assertEquals(1, client.peek("slots", "job").remaining());
    assertTrue(client.acquire("slots", "job").allowed());
  }

  @Test
  void acquireWaitIsHeldUntilTheUnitIsDue() {
    // Paced at 20/s: the first passes at once, the second 50 ms later.
    Decision first = client.acquireWait("paced", "w", 1, 1000);
    Decision second = client.acquireWait("paced", "w", 1, 1000);
    assertTrue(first.allowed());
    assertTrue(second.allowed());
    assertTrue(second.waitedMs() >= 20, "waited " + second.waitedMs());
  }

  @Test
  void resetForgetsAKeyForTheDaemonsOwnUser() {
    client.acquire("two", "reset", 2);
    assertFalse(client.acquire("two", "reset").allowed());
    Decision fresh = client.reset("two", "reset");
    assertEquals(2, fresh.remaining());
    assertTrue(client.acquire("two", "reset").allowed());
  }

  @Test
  void healthSaysOkWithoutRedis() {
    Health health = client.health();
    assertEquals("ok", health.status());
    assertEquals("none", health.redis());
    assertTrue(health.fields().containsKey("version"), health.fields().toString());
  }

  @Test
  void callDecodesAGenericResult() {
    List<?> rules = (List<?>) client.call("rules");
    List<Object> names = new java.util.ArrayList<>();
    for (Object rule : rules) {
      names.add(((Map<?, ?>) rule).get("name"));
    }
    assertEquals(List.of("five", "two", "slots", "paced", "budget", "capped"), names);
    Map<?, ?> five = (Map<?, ?>) rules.get(0);
    assertEquals("fixed_window", five.get("algorithm"));
  }

  @Test
  void anUnknownRuleIsAServerErrorWithTheDaemonsCode() {
    SluiceException e = assertThrows(SluiceException.class, () -> client.acquire("nope", "k"));
    assertEquals(ErrorCode.ESERVER, e.code());
    assertEquals("UNKNOWN_RULE", e.serverCode());
    assertFalse(e.serverMessage().isEmpty());
    // A server error is no reason to fail open.
    assertEquals(0, client.failedOpenCount());
  }

  @Test
  void anUnknownMethodIsAServerError() {
    SluiceException e = assertThrows(SluiceException.class, () -> client.call("frobnicate"));
    assertEquals("UNKNOWN_METHOD", e.serverCode());
  }

  @Test
  void aTimeoutTooLargeForNanosecondsWaitsWithoutBound() {
    assertTrue(client.acquire("five", "huge-timeout".getBytes(
        java.nio.charset.StandardCharsets.US_ASCII), 1, Long.MAX_VALUE).allowed());
    assertFalse(client.acquire("five", "huge-timeout".getBytes(
        java.nio.charset.StandardCharsets.US_ASCII), 1, Long.MAX_VALUE).unreachable());
  }

  @Test
  void badArgumentsFailWithEinvalBeforeAnythingIsSent() {
    long before = client.nextMsgid();
    assertEquals(ErrorCode.EINVAL,
        assertThrows(SluiceException.class, () -> client.acquire("five", "k", -1)).code());
    assertEquals(ErrorCode.EINVAL,
        assertThrows(SluiceException.class, () -> client.acquire(null, "k")).code());
    assertEquals(ErrorCode.EINVAL,
        assertThrows(SluiceException.class, () -> client.acquireAll(List.of())).code());
    assertEquals(before, client.nextMsgid());
  }

  @Test
  void utf8CheckMatchesTheStandard() {
    assertTrue(SluiceClient.isUtf8("plain, \u00e9, \u20ac, \ud83d\ude00".getBytes(
        java.nio.charset.StandardCharsets.UTF_8)));
    assertFalse(SluiceClient.isUtf8(new byte[] {(byte) 0xc0, (byte) 0x80})); // overlong
    assertFalse(SluiceClient.isUtf8(new byte[] {(byte) 0xed, (byte) 0xa0, (byte) 0x80})); // surrogate
    assertFalse(SluiceClient.isUtf8(new byte[] {(byte) 0xe2, (byte) 0x82})); // truncated
  }

  @Test
  void aResetTimeOf2To32MillisecondsOrMoreIsReadAsANumber() {
    // A 366-day window resets in about 3.2e10 ms, which comes as a uint 64.
    Decision d = client.acquire("budget", "long-window");
    assertFalse(d.unreachable(), String.valueOf(d.unreachableCause()));
    assertTrue(d.resetAfterMs() > 0xffff_ffffL, d.toString());
    assertEquals(BUDGET - 1, d.remaining());
    assertEquals(d.resetAfterMs(), client.peek("budget", "long-window").resetAfterMs(), 1000);
  }

  @Test
  void settleBelowTheEstimateRefundsTheDifference() {
    Reservation r = client.reserve("budget", "refund", 8);
    assertTrue(r.allowed() && r.reserved(), r.toString());
    assertEquals(BUDGET - 8, r.decision().remaining());
    assertEquals(Mode.LOCAL, r.decision().mode());
    Settlement s = client.settle(r.id(), 3);
    assertEquals(r.id(), s.id());
    assertEquals(5, s.refunded());
    assertEquals(0, s.debt());
    assertEquals(BUDGET - 3, s.decision().remaining());
    assertEquals(BUDGET - 3, client.peek("budget", "refund").remaining());
    assertTrue(client.acquire("budget", "refund", BUDGET - 3).allowed());
  }

  @Test
  void settleAboveTheEstimateLeavesDebt() {
    Reservation r = client.reserve("budget", "debt", BUDGET, 5_000);
    Settlement s = client.settleAsync(r.id(), BUDGET + 4, 10_000).join();
    assertEquals(0, s.refunded());
    assertEquals(4, s.debt());
    assertEquals(-4, s.decision().remaining());
    assertFalse(s.decision().allowed());
    Decision d = client.acquire("budget", "debt");
    assertFalse(d.allowed());
    assertEquals(-4, d.remaining());
    assertEquals(0, s.unpaid());
  }

  @Test
  void settlePastTheDebtBoundReportsWhatItLeftUnpaid() {
    Reservation r = client.reserve("capped", "runaway", BUDGET);
    Settlement s = client.settle(r.id(), BUDGET + 5);
    assertEquals(CAPPED_DEBT, s.debt());
    assertEquals(5 - CAPPED_DEBT, s.unpaid());
    assertEquals(-CAPPED_DEBT, s.decision().remaining());
  }

  @Test
  void cancelRefundsTheWholeEstimate() {
    Reservation r = client.reserveAsync("budget", "cancel".getBytes(
        java.nio.charset.StandardCharsets.US_ASCII), 6, 60_000, 10_000).join();
    Settlement s = client.cancel(r.id());
    assertEquals(r.id(), s.id());
    assertEquals(6, s.refunded());
    assertEquals(BUDGET, s.decision().remaining());
    assertEquals(BUDGET, client.peek("budget", "cancel").remaining());
  }

  @Test
  void settleOfAnIdNotOpenIsAnUnknownReservation() {
    Reservation r = client.reserve("budget", "unknown", 2);
    client.settle(r.id(), 2);
    for (org.junit.jupiter.api.function.Executable again : List.<org.junit.jupiter.api.function.Executable>of(
        () -> client.settle(r.id(), 1), () -> client.cancel(r.id()),
        () -> client.settle(r.id() + 1000, 1))) {
      SluiceException e = assertThrows(SluiceException.class, again);
      assertEquals(ErrorCode.ESERVER, e.code());
      assertEquals(SluiceException.UNKNOWN_RESERVATION, e.serverCode());
      assertTrue(e.unknownReservation());
    }
    SluiceException other = assertThrows(SluiceException.class,
        () -> client.reserve("slots", "k", 1));
    assertEquals("BAD_REQUEST", other.serverCode());
    assertFalse(other.unknownReservation());
  }

  @Test
  void reserveOnADeniedKeyIsDeniedWithNoId() {
    client.reserve("budget", "denied", BUDGET - 1);
    Reservation denied = client.reserve("budget", "denied", 2);
    assertFalse(denied.allowed());
    assertFalse(denied.reserved());
    assertEquals(0, denied.id());
    assertEquals(1, denied.decision().remaining());
    assertTrue(denied.decision().retryAfterMs() > 0);
    long before = client.nextMsgid();
    Settlement nothing = client.settle(denied.id(), 2);
    assertEquals(before, client.nextMsgid(), "settling id 0 sent a request");
    assertTrue(nothing.decision().allowed());
    assertEquals(0, nothing.refunded());
    assertEquals(1, client.peek("budget", "denied").remaining());
    assertEquals(ErrorCode.EINVAL,
        assertThrows(SluiceException.class, () -> client.reserve("budget", "k", 0)).code());
    assertEquals(ErrorCode.EINVAL,
        assertThrows(SluiceException.class, () -> client.settle(7, -1)).code());
  }
}
