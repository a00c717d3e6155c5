// Worker: one thread, one libuv loop, many client connections.
//
// Thread model (the whole daemon's, written once here):
//  - The main thread runs the server's loop: it accepts connections, handles
//    signals, sweeps the key table and reloads the config.
//  - Each worker thread runs its own loop and owns its connections, its
//    dispatcher and its metrics shard; nothing else touches them.
//  - Workers share the key table (lock-free lookups, see key_table.h) and
//    the immutable rule sets (shared_ptr<const RuleSet>).
//  - The main thread talks to a worker only through post(): a message queue
//    guarded by a mutex, plus a uv_async_t that wakes the worker's loop. The
//    mutex is taken once per accepted connection or reload, never per
//    request.
//  - The control thread (control.h) runs the lease path: workers hand it
//    lease requests through the LeaseBroker's queue; it writes the answers
//    into the keys' slices and wakes the workers through notifyLeases() (the
//    same uv_async_t), so a request deferred for a lease is answered. Only
//    a worker holding requests that wait for such news (Waiting::awaitsNews)
//    is woken: each worker publishes that in awaits_news_, under the
//    mutex. News that finds it down is remembered (news_missed_), and a
//    worker that raises it wakes itself once if news came meanwhile: a
//    reply written after the worker looked at its slice and before it
//    raised the flag is not lost.
//    Not per key: a woken worker asks all its lease and line waiters again
//    (Waiting::askAgain), so a per-key registry would spare only workers
//    that also wait on other keys, at the price of a shared map on every
//    deferral.
//  - A worker may have a lane (the Envoy front's): a second Dispatcher,
//    with its own metrics shard and key-table reader, that a front on a
//    thread of its own decides on, on that thread, under lane_mutex_, so a
//    question answered at once costs no hop to this loop and back. The
//    lane's ReaderId is used by one thread at a time, whoever holds
//    lane_mutex_ (the mutex orders its guards). A question the lane leaves
//    waiting is this loop's: the asking thread posts kLaneWaits, and the
//    loop counts the lane's waiters in awaits_news_ and its lease timer,
//    and asks them again with its own (under lane_mutex_), so their
//    answers come on this thread. The front takes the lane with try_lock
//    and submits when it is busy: the lock never makes a gRPC thread wait
//    for this loop.
#pragma once

#include <uv.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "clock.h"
#include "config.h"
#include "connection.h"
#include "dispatch.h"
#include "key_table.h"
#include "metrics.h"
#include "question.h"
#include "http_front.h"
#include "resp_front.h"
#include "rpc.h"
#include "rpc_front.h"

namespace sluice {

// What a worker needs to know of the configuration.
struct WorkerOptions {
  rpc::Limits protocol;
  size_t max_output_bytes = 4 << 20;
  int64_t idle_timeout_ms = 300'000;
  int64_t partial_frame_timeout_ms = 10'000;
  int64_t shutdown_timeout_ms = 5'000;
  // A connection the codec ended reads and drops what the client still
  // sends for at most this long and this much before it closes
  // (connection.h, lingering close).
  int64_t linger_ms = 2'000;
  size_t linger_max_bytes = 1 << 20;
  int64_t lease_timeout_ms = 50;  // longest a request waits for a lease
  resp::Limits resp;              // [resp] connections' commands
  HttpFront::Options http;        // [http] connections' requests and answers
};

class Worker {
 public:
  // `broker` is null without Redis; `throttle_rules` adds CL.THROTTLE's
  // rules (RespFront::EnsureRule), empty without [resp]; `lane_metrics`,
  // the lane's shard (decideOnLane), null for a worker without a lane.
  Worker(size_t index, const WorkerOptions& options, KeyTable& keys, MetricsShard& metrics,
         DaemonStatus& status, RuleSetPtr rules, LeaseBroker* broker = nullptr,
         RespFront::EnsureRule throttle_rules = {}, MetricsShard* lane_metrics = nullptr);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Starts the thread that runs the loop; messages posted before it runs wait.
  void start();
  // Thread-safe: hands an accepted socket that speaks `protocol` to this
  // worker.
  void adopt(int fd, const Peer& peer, Protocol protocol = Protocol::kMsgpackRpc);
  // Thread-safe: later requests use `rules`; the lane's, once it returns.
  void setRules(RuleSetPtr rules);
  // Thread-safe: the seam (dispatch.h) for a front on a thread of its own
  // (gRPC). The worker decides `question` on its loop and calls
  // recipient->receive(tag, answer) there, at once or when it stops
  // waiting (waiting.h bounds every wait); a stopped worker answers
  // OVERLOADED on the caller's thread. The recipient must live until it
  // has received its answer.
  void submit(HeldQuestion question, Recipient* recipient, MsgId tag);
  // Thread-safe: decides `question` (an acquire, acquire_all or peek) on
  // this worker's lane, on the calling thread (see the thread model), and
  // returns true with `outcome`: kAnswered with `answer` filled, or a wait,
  // whose answer goes to recipient->receive(tag, answer) later, on this
  // worker's thread (the recipient lives until then). false, having done
  // nothing, when the worker has no lane, another thread is on it, or the
  // method is another: then submit().
  bool decideOnLane(const Question& question, Recipient* recipient, MsgId tag, Answer* answer,
                    Outcome* outcome);
  // Before start(): the daemon's workers, by index, so that a settle of a
  // reservation another worker holds goes there (Reservations::workerOf);
  // its answer comes back to this worker's loop (a relay) for the
  // connection that asked. Workers outlive each other's threads (the server
  // joins them all before destroying any).
  void setSiblings(std::vector<Worker*> siblings) { siblings_ = std::move(siblings); }
  // Thread-safe: answers what is in flight, closes every connection and ends
  // the thread; join() waits for it.
  void stop();
  void join();
  // Thread-safe: lease answers have arrived; deferred requests may go on.
  // Wakes the worker only when it has requests that wait for them.
  void notifyLeases();
  // Times notifyLeases() woke this worker (any thread; relaxed).
  uint64_t leaseWakeups() const { return lease_wakeups_.load(std::memory_order_relaxed); }
  // Thread-safe: the loop stores `seq` as pong() once it gets to it, so the
  // server's watchdog can tell a live loop from a stuck one.
  void ping(uint64_t seq);
  uint64_t pong() const { return pong_.load(std::memory_order_acquire); }

  // Number of open connections; any thread (relaxed).
  size_t connections() const { return connection_count_.load(std::memory_order_relaxed); }
  // The loop's open handles (openHandles) as of its last connection sweep;
  // any thread (relaxed).
  size_t handles() const { return handle_count_.load(std::memory_order_relaxed); }

  // Used by Connection, on this worker's thread only.
  uv_loop_t* loop() { return &loop_; }
  const WorkerOptions& options() const { return options_; }
  Dispatcher& dispatcher() { return dispatcher_; }
  // The codec of a new connection of `peer` (who must outlive it).
  std::unique_ptr<Codec> makeCodec(Protocol protocol, const Peer& peer);
  // A connection's answer, reused between questions.
  Answer& answerScratch() { return answer_; }
  bool stopping() const { return stopping_; }
  // Resumes `connection` (Connection::resume) on a later turn of the loop.
  void resumeLater(Connection* connection);
  MetricsShard& metrics() { return metrics_; }
  KeyTable& keys() { return keys_; }
  KeyTable::ReaderId readerSlot() const { return reader_slot_; }
  // One read's landing space, shared by the worker's connections: a read is
  // parsed before the next one starts, so one buffer serves them all.
  std::span<uint8_t> readScratch() { return read_scratch_; }
  void onConnectionClosed(Connection* connection);
  // Arms the timer that answers deferred requests at their deadline.
  void armLeaseTimer();
  // Logs a request that could not be parsed, at most a few lines a second.
  void logBadInput(const rpc::ParseResult& result);
  // Counts and logs (sharing logBadInput's rate) a request whose map form
  // had entries the method does not know (rpc::Request::unknown_fields).
  void noteUnknownFields(const rpc::Request& request);

 private:
  struct Message {
    enum class Kind { kAdopt, kRules, kStop, kPing, kAsk, kRelayed, kLaneWaits };
    explicit Message(Kind k) : kind(k) {}
    Kind kind;
    int fd = -1;
    Peer peer;
    Protocol protocol = Protocol::kMsgpackRpc;  // kAdopt
    RuleSetPtr rules;
    uint64_t seq = 0;  // kPing
    HeldQuestion question;  // kAsk, with its recipient and tag
    Recipient* recipient = nullptr;
    MsgId tag;
    uint64_t relay = 0;  // kRelayed: the relay's token, and its answer
    Answer answer;
  };
  class Relay;
  // Hands a settle to sibling `worker`; false when there is none to ask.
  bool routeSettle(uint32_t worker, const Question& question, Recipient* recipient, MsgId tag);
  // Any thread: a sibling's answer to a relayed settle, for this loop.
  void postRelayed(uint64_t relay, const Answer& answer);
  void post(Message message);
  // A submitted question (kAsk): decided here, answered to its recipient.
  void ask(const Message& message);
  static void refuseStopped(const Message& message);
  void run();
  void onMessages();
  void onSweep();
  // Answers the deferred requests that can be answered (all when stopping).
  void retryDeferred();
  // Publishes whether requests wait for lease news (awaits_news_); on
  // raising it, wakes this worker once if news came while it was down.
  void noteWaiters();
  // Sets lease_news_ and wakes the loop (the caller holds mutex_).
  void wakeForNewsLocked();
  // The lane's waiters (none without a lane); loop thread, takes lane_mutex_.
  bool laneAwaitsNews();
  // The earliest deadline or due time of a deferred request, the lane's
  // too; INT64_MAX when none waits. Loop thread.
  int64_t nextDeferredDeadlineNs();
  void beginStop();
  void finishIfDrained();

  size_t index_;
  WorkerOptions options_;
  KeyTable& keys_;
  MetricsShard& metrics_;
  Dispatcher dispatcher_;
  RpcFront rpc_front_;
  RespFront resp_front_;
  HttpFront http_front_;
  KeyTable::ReaderId reader_slot_;
  Answer answer_;  // a submitted question's or a connection's, reused

  // The lane (decideOnLane): null without one, else set at construction.
  // lane_mutex_ guards the lane's dispatcher, its reader's guards and
  // lane_stopping_ (set once the loop has answered every waiter: the lane
  // may leave none waiting after it).
  std::unique_ptr<Dispatcher> lane_;
  KeyTable::ReaderId lane_reader_;
  std::mutex lane_mutex_;
  bool lane_stopping_ = false;

  uv_loop_t loop_;
  uv_async_t wakeup_;
  uv_timer_t sweep_timer_;
  uv_timer_t stop_timer_;
  uv_timer_t lease_timer_;  // the earliest deferred request's deadline
  uv_idle_t resume_idle_;   // runs while resuming_ holds connections
  std::thread thread_;

  std::mutex mutex_;  // guards inbox_, lease_news_, news_missed_, wakeup_closed_
  std::vector<Message> inbox_;
  bool lease_news_ = false;         // notifyLeases() since the last wakeup
  // Whether this worker holds requests that wait for lease news: written by
  // the worker under mutex_ (noteWaiters), read by the control thread under
  // it (notifyLeases); the worker reads its own value without it.
  std::atomic<bool> awaits_news_{false};
  bool news_missed_ = false;  // notifyLeases() found awaits_news_ down
  std::atomic<uint64_t> lease_wakeups_{0};
  bool wakeup_closed_ = false;      // wakeup_ is closing: nothing may send to it
  std::vector<Message> taken_;      // loop thread only

  std::vector<Connection*> connections_;  // loop thread only
  std::vector<Connection*> resuming_;     // loop thread only: resumeLater()
  std::vector<Worker*> siblings_;         // set before start(), then read only
  // Settles relayed to a sibling, by token: who asked (loop thread only).
  struct Relayed {
    Recipient* recipient = nullptr;
    MsgId tag;
  };
  std::unordered_map<uint64_t, Relayed> relays_;
  uint64_t next_relay_ = 1;
  std::vector<uint8_t> read_scratch_;     // loop thread only
  std::atomic<size_t> connection_count_{0};
  std::atomic<size_t> handle_count_{0};
  std::atomic<uint64_t> pong_{0};
  bool stopping_ = false;

  // Whether a bad-input line may be logged now; when not, it is counted in
  // log_suppressed_, which the next logged line reports (suppressedNote()).
  bool mayLogBadInput();
  std::string suppressedNote();

  int64_t log_window_ms_ = 0;     // start of the current one-second log window
  int log_lines_ = 0;             // bad-input lines logged in that window
  uint64_t log_suppressed_ = 0;   // lines not logged since the last one
};

}  // namespace sluice
