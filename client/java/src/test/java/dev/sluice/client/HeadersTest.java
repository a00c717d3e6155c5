package dev.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * RateLimitHeaders against libsluice's sluice_format_headers, byte for byte,
 * through the FORMAT_HEADERS filter (tests/support/format_headers.c).
 */
class HeadersTest {
  /** allowed remaining limit reset_after_ms retry_after_ms window_s policy */
  static final String[] CASES = {
      "1\t19\t100\t600\t0\t60\tapi",
      "1\t0\t1\t0\t0\t0\tapi",
      "0\t0\t100\t30000\t2500\t60\tapi",
      "0\t0\t100\t1000\t1000\t60\tapi",
      "0\t0\t100\t1001\t1001\t60\tapi",
      "0\t0\t100\t1\t1\t-5\tapi",
      "0\t0\t100\t0\t0\t60\tapi",
      "0\t0\t100\t-10\t-10\t60\tapi",
      "1\t-3\t-1\t-1\t0\t1\tapi",
      "1\t10000000000000000\t9223372036854775807\t9223372036854775807\t0\t9223372036854775807\tx",
      "0\t5\t10\t999\t999\t3600\tlogin",
      "0\t5\t10\t86400000\t3599001\t86400\tpro:tier",
      "1\t1\t2\t3\t4\t5\tsay \"hi\"",
      "1\t1\t2\t3\t4\t5\tback\\slash",
      "1\t1\t2\t3\t4\t5\t~!#$%&'()*+,-./:;<=>?@[]^_`{|}",
      "1\t1\t2\t3\t4\t5\t" + "a".repeat(64),
      "1\t1\t2\t3\t4\t5\t" + "a".repeat(65),
      "1\t1\t2\t3\t4\t5\ttab\there",
      "1\t1\t2\t3\t4\t5\tcaf\u00e9",
      "1\t1\t2\t3\t4\t5\tdel\u007f",
  };

  static String java(String line) {
    String[] f = line.split("\t", 7);
    try {
      RateLimitHeaders h = RateLimitHeaders.format(f[0].equals("1"), Long.parseLong(f[1]),
          Long.parseLong(f[2]), Long.parseLong(f[3]), Long.parseLong(f[4]), f[6],
          Long.parseLong(f[5]));
      return h.rateLimit() + "\t" + h.rateLimitPolicy() + "\t" + h.retryAfter();
    } catch (SluiceException e) {
      return "error " + e.code().value();
    }
  }

  static List<String> libsluice(String[] lines) throws IOException, InterruptedException {
    String filter = System.getenv("FORMAT_HEADERS");
    if (filter == null || filter.isEmpty()) {
      throw new IllegalStateException("FORMAT_HEADERS must name tests/support/format_headers");
    }
    Process p = new ProcessBuilder(filter).redirectError(ProcessBuilder.Redirect.INHERIT).start();
    try (OutputStream in = p.getOutputStream()) {
      in.write((String.join("\n", lines) + "\n").getBytes(StandardCharsets.UTF_8));
    }
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertEquals(0, p.waitFor(), "format_headers failed");
    List<String> result = new ArrayList<>(List.of(out.split("\n", -1)));
    assertEquals("", result.remove(result.size() - 1));
    return result;
  }

  @Test
  void everyCaseFormatsExactlyAsLibsluiceDoes() throws Exception {
    List<String> expected = libsluice(CASES);
    assertEquals(CASES.length, expected.size());
    for (int i = 0; i < CASES.length; i++) {
      assertEquals(expected.get(i), java(CASES[i]), "case " + CASES[i]);
    }
  }

  @Test
  void theTableCoversAllowedDeniedAndRefusedCases() throws Exception {
    // Guards the table above: it must hold both outcomes and refusals.
    List<String> expected = libsluice(CASES);
    assertEquals(true, expected.stream().anyMatch(s -> s.startsWith("error ")));
    assertEquals(true, expected.stream().anyMatch(s -> s.endsWith("\t")));
    assertEquals(true, expected.stream().anyMatch(s -> s.matches(".*\t[0-9]+$")));
  }

  @Test
  void aDecisionFormatsLikeItsFields() {
    Decision d = new Decision(false, Mode.LOCAL, 0, 100, 30_000, 2_500, -1, null, null);
    RateLimitHeaders h = RateLimitHeaders.format(d, "api", 60);
    assertEquals("\"api\";r=0;t=30", h.rateLimit());
    assertEquals("\"api\";q=100;w=60", h.rateLimitPolicy());
    assertEquals("3", h.retryAfter());
  }

  @Test
  void anEmptyOrMissingPolicyNameIsRefused() {
    Decision d = new Decision(true, Mode.LOCAL, 1, 2, 3, 0, -1, null, null);
    assertEquals(ErrorCode.EINVAL,
        assertThrows(SluiceException.class, () -> RateLimitHeaders.format(d, "", 1)).code());
    assertEquals(ErrorCode.EINVAL,
        assertThrows(SluiceException.class, () -> RateLimitHeaders.format(d, null, 1)).code());
  }
}
