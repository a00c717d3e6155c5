package dev.sluice.client;

/**
 * The answer of {@link SluiceClient#settle} and {@link SluiceClient#cancel}.
 * Settling id 0 (a reservation that was never opened) asks the daemon
 * nothing: an allowed decision with every number 0, id 0.
 *
 * @param decision the key's state afterwards: {@code remaining} is below 0
 *     while the key is in debt, {@code allowed} whether it could spend now
 * @param id the reservation settled
 * @param refunded the units given back (estimate - actual)
 * @param debt the units charged past the estimate
 * @param unpaid the units of the excess past the rule's max_debt that nobody
 *     was charged
 */
public record Settlement(Decision decision, long id, long refunded, long debt, long unpaid) {

  static final Settlement NOTHING =
      new Settlement(new Decision(true, Mode.UNKNOWN, 0, 0, 0, 0, -1, null, null), 0, 0, 0, 0);

  /** A settlement that left nothing unpaid: the constructor of the four fields. */
  public Settlement(Decision decision, long id, long refunded, long debt) {
    this(decision, id, refunded, debt, 0);
  }
}
