package dev.sluice.client;

import java.nio.charset.StandardCharsets;
import java.util.Objects;

/**
 * One (rule, key, cost) of {@link SluiceClient#acquireAll}. The key is any
 * bytes; a String key is its UTF-8 bytes.
 */
public record Item(String rule, byte[] key, long cost) {
  public Item {
    Objects.requireNonNull(rule, "rule");
    Objects.requireNonNull(key, "key");
  }

  public Item(String rule, String key, long cost) {
    this(rule, key.getBytes(StandardCharsets.UTF_8), cost);
  }
}
