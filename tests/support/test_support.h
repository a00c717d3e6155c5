// Test support: short temporary directories (Unix socket paths are limited to
// 108 bytes) and child processes started and reaped by a fixture.
#pragma once

#include <string>
#include <vector>

#include <sys/types.h>

// SLUICE_SANITIZED is defined in ASan and TSan builds, whose allocators do
// not report through mallinfo2(): tests that measure the heap leave
// themselves out of those builds with it rather than skip.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SLUICE_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SLUICE_SANITIZED 1
#endif
#endif

namespace sluice::test {

// A fresh directory under /tmp, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name
  std::string file(const std::string& name) const;

 private:
  std::string path_;
};

// Writes `text` to `path`, replacing it.
void writeFile(const std::string& path, const std::string& text);

// A child process, killed (SIGKILL) and reaped on destruction unless waited for.
class Child {
 public:
  // Starts argv[0] with arguments; stdout and stderr go to `log_path` when set.
  explicit Child(const std::vector<std::string>& argv, const std::string& log_path = "");
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  // Sends `signal` (e.g. SIGTERM).
  void signal(int signal);
  // Waits at most timeout_ms for exit; returns the exit status as from
  // waitpid(), or -1 when the child is still running.
  int wait(int timeout_ms);

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_status_ = 0;
};

// Polls `predicate` every millisecond for at most timeout_ms.
template <typename Predicate>
bool waitFor(int timeout_ms, Predicate predicate);

// The file's whole contents, or "" when it cannot be read.
std::string readFile(const std::string& path);

// Environment variable or a default.
std::string env(const char* name, const std::string& fallback = "");

#ifdef SLUICE_TEST_SLUICED
// The binaries under test (integration tests only; see tests/CMakeLists.txt).
inline std::string sluicedPath() { return env("SLUICED", SLUICE_TEST_SLUICED); }
inline std::string sluicectlPath() { return env("SLUICECTL", SLUICE_TEST_SLUICECTL); }
#endif

}  // namespace sluice::test

#include "test_support_inl.h"
