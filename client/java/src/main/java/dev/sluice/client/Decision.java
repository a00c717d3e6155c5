package dev.sluice.client;

/**
 * One decision of the daemon (a decision map), or one made by the client's
 * {@link UnreachablePolicy} when the daemon could not answer.
 *
 * @param allowed whether the units were granted (and spent)
 * @param mode how the daemon decided
 * @param remaining units left now
 * @param limit the rule's limit
 * @param resetAfterMs milliseconds until the key is back at its full limit
 * @param retryAfterMs milliseconds until a retry may pass; 0 when allowed
 * @param waitedMs how long the daemon held a waiting acquire; -1 when it did not say
 * @param reason the daemon's "reason" (e.g. "cost exceeds limit"), or null
 * @param unreachableCause for a policy decision, why the daemon did not
 *     decide (its code is {@link ErrorCode#unreachable()}); null for the daemon's own
 */
public record Decision(boolean allowed, Mode mode, long remaining, long limit, long resetAfterMs,
    long retryAfterMs, long waitedMs, String reason, SluiceException unreachableCause) {

  /** Whether the unreachable-daemon policy made this decision, not the daemon. */
  public boolean unreachable() {
    return unreachableCause != null;
  }

  static Decision ofPolicy(UnreachablePolicy policy, SluiceException cause) {
    boolean open = policy == UnreachablePolicy.FAIL_OPEN;
    return new Decision(open, Mode.UNKNOWN, 0, 0, 0, open ? 0 : 1000, -1, null, cause);
  }
}
