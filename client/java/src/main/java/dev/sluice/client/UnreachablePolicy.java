package dev.sluice.client;

/**
 * What {@code acquire} and {@code acquireAll} answer when the daemon cannot
 * be reached or does not answer in time (a failure whose code is
 * {@link ErrorCode#unreachable()}): such a call completes with a decision of
 * this policy instead of an error, marked {@link Decision#unreachable()}, and
 * the client counts it ({@link SluiceClient#failedOpenCount()},
 * {@link SluiceClient#failedClosedCount()}).
 */
public enum UnreachablePolicy {
  /** Allow the request (the default: the limiter never takes the app down). */
  FAIL_OPEN,
  /** Deny the request, with a retry after one second. */
  FAIL_CLOSED
}
