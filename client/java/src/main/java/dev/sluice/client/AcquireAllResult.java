package dev.sluice.client;

import java.util.List;

/**
 * The answer of {@link SluiceClient#acquireAll}: {@code allowed} only when
 * every item passed (and then each was spent); {@code results.get(i)} is the
 * decision for item i.
 */
public record AcquireAllResult(boolean allowed, List<Decision> results) {
  public AcquireAllResult {
    results = List.copyOf(results);
  }
}
