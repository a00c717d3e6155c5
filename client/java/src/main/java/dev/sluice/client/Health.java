package dev.sluice.client;

import java.util.Map;

/**
 * The daemon's `health` result: {@code status} "ok" or "degraded",
 * {@code redis} "up", "down" or "none", and every field of the map as
 * decoded ({@link SluiceClient#call} describes the types).
 */
public record Health(String status, String redis, Map<String, Object> fields) {
  public Health {
    fields = java.util.Collections.unmodifiableMap(new java.util.LinkedHashMap<>(fields));
  }
}
