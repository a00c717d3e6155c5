package dev.sluice.client;

/** How the daemon reached a decision (a decision map's `mode`). */
public enum Mode {
  /** Missing, a mode newer than this library, or decided by the unreachable policy. */
  UNKNOWN("unknown"),
  /** Global rule, Redis healthy. */
  NORMAL("normal"),
  /** Global rule on its local share, Redis down. */
  FALLBACK("fallback"),
  /** Redis down, rule fails open. */
  OPEN("open"),
  /** Redis down, rule fails closed. */
  CLOSED("closed"),
  /** Shadow rule: decided and counted, always allowed. */
  SHADOW("shadow"),
  /** Local-only rule. */
  LOCAL("local"),
  /** Key blocked by its rule's penalty. */
  BLOCKED("blocked");

  private final String wireName;

  Mode(String wireName) {
    this.wireName = wireName;
  }

  /** The name on the wire ("local", ...); "unknown" for UNKNOWN. */
  public String wireName() {
    return wireName;
  }

  /** The mode a wire name stands for; UNKNOWN for any other name. */
  public static Mode fromWireName(String name) {
    for (Mode mode : values()) {
      if (mode != UNKNOWN && mode.wireName.equals(name)) {
        return mode;
      }
    }
    return UNKNOWN;
  }
}
