package dev.sluice.client;

/**
 * What {@code acquire}, {@code acquireAll} and {@code reserve} answer when the daemon cannot
 * be reached or does not answer in time (a failure whose code is
 * {@link ErrorCode#unreachable()}): such a call completes with a decision of
 * this policy instead of an error, marked {@link Decision#unreachable()}, and
 * the client counts it ({@link SluiceClient#failedOpenCount()},
 * {@link SluiceClient#failedClosedCount()}). A policy's {@link Reservation}
 * has id 0: settling or cancelling it asks the daemon nothing.
 */
public enum UnreachablePolicy {
  /** Allow the request (the default: the limiter never takes the app down). */
  FAIL_OPEN,
  /** Deny the request, with a retry after one second. */
  FAIL_CLOSED
}
