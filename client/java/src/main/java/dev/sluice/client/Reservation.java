package dev.sluice.client;

/**
 * The answer of {@link SluiceClient#reserve}: the decision of the estimate
 * and the reservation's id, to {@link SluiceClient#settle} or
 * {@link SluiceClient#cancel}.
 *
 * @param decision the daemon's decision of the estimate, or the
 *     {@link UnreachablePolicy}'s ({@link Decision#unreachable()})
 * @param id the reservation, opaque (the daemon's unsigned 64 bits); 0 when
 *     none was opened: denied, or decided by the policy
 */
public record Reservation(Decision decision, long id) {

  /** Whether the estimate was granted (and spent). */
  public boolean allowed() {
    return decision.allowed();
  }

  /** Whether a reservation was opened, so that settling it asks the daemon. */
  public boolean reserved() {
    return id != 0;
  }
}
