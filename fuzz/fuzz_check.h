// fuzz_check: how a fuzz target reports a broken property. It prints what
// broke and aborts, so that libFuzzer saves the input as a crash and the
// replay driver fails its test; it is never compiled out.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(condition, what)                                                   \
  do {                                                                                \
    if (!(condition)) {                                                               \
      std::fprintf(stderr, "%s:%d: property broken: %s (%s)\n", __FILE__, __LINE__, \
                   what, #condition);                                                 \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)
