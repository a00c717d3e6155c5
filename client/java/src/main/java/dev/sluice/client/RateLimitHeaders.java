package dev.sluice.client;

/**
 * The header values a server returns with a decision, byte for byte what
 * libsluice's {@code sluice_format_headers} gives, in the structured-field
 * form of draft-ietf-httpapi-ratelimit-headers-10:
 * <pre>
 *   RateLimit:        "api";r=20;t=30   (r = remaining, t = seconds to reset)
 *   RateLimit-Policy: "api";q=100;w=60  (q = limit, w = window in seconds,
 *                                        omitted when windowS &lt;= 0)
 *   Retry-After:      3                 (RFC 9110 delay-seconds, rounded up,
 *                                        at least 1; "" when allowed)
 * </pre>
 * Times are rounded up to whole seconds, so a client never retries early;
 * numbers are clamped to 0..999,999,999,999,999 (RFC 8941 sf-integer).
 *
 * @param rateLimit the RateLimit value
 * @param rateLimitPolicy the RateLimit-Policy value
 * @param retryAfter the Retry-After value; "" when the decision allowed
 */
public record RateLimitHeaders(String rateLimit, String rateLimitPolicy, String retryAfter) {
  /** The longest policy name accepted, before escaping. */
  public static final int POLICY_NAME_MAX_BYTES = 64;

  private static final long SF_INTEGER_MAX = 999_999_999_999_999L;

  /**
   * Formats the headers of `decision` under `policy` (usually the rule name:
   * 1 to 64 characters of printable ASCII; '"' and '\' are escaped).
   *
   * @throws SluiceException EINVAL for a policy name outside those bounds
   */
  public static RateLimitHeaders format(Decision decision, String policy, long windowS) {
    return format(decision.allowed(), decision.remaining(), decision.limit(),
        decision.resetAfterMs(), decision.retryAfterMs(), policy, windowS);
  }

  /** {@link #format(Decision, String, long)} from the decision's fields. */
  public static RateLimitHeaders format(boolean allowed, long remaining, long limit,
      long resetAfterMs, long retryAfterMs, String policy, long windowS) {
    if (policy == null || policy.isEmpty() || policy.length() > POLICY_NAME_MAX_BYTES) {
      throw new SluiceException(ErrorCode.EINVAL, "policy name must be 1 to 64 bytes");
    }
    StringBuilder quoted = new StringBuilder(policy.length() + 8).append('"');
    for (int i = 0; i < policy.length(); i++) {
      char ch = policy.charAt(i);
      if (ch < 0x20 || ch > 0x7e) {
        throw new SluiceException(ErrorCode.EINVAL, "policy name must be printable ASCII");
      }
      if (ch == '"' || ch == '\\') {
        quoted.append('\\');
      }
      quoted.append(ch);
    }
    quoted.append('"');
    String name = quoted.toString();
    String rateLimit = name + ";r=" + clamp(remaining) + ";t=" + clamp(ceilSeconds(resetAfterMs));
    String rateLimitPolicy = name + ";q=" + clamp(limit) + (windowS > 0 ? ";w=" + clamp(windowS) : "");
    String retryAfter = "";
    if (!allowed) {
      // A denial always says to wait at least a second: "0" invites a hot loop.
      retryAfter = Long.toString(clamp(Math.max(1, ceilSeconds(retryAfterMs))));
    }
    return new RateLimitHeaders(rateLimit, rateLimitPolicy, retryAfter);
  }

  private static long clamp(long value) {
    return value < 0 ? 0 : Math.min(value, SF_INTEGER_MAX);
  }

  /** Whole seconds, rounded up. */
  private static long ceilSeconds(long ms) {
    return ms <= 0 ? 0 : ms / 1000 + (ms % 1000 != 0 ? 1 : 0);
  }
}
