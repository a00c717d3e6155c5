#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets: fuzz/corpus/<target>/<name>.

Run from anywhere with /usr/bin/python3 (python3-msgpack); it rewrites the
seeds it knows and leaves every other file (inputs found by fuzzing, fixed
crashes named crash-*) alone.

The rpc seeds are written for the harness in rpc_fuzz.cpp: its rule names
(tb, gcra, fw, sl, conc, ..., the policies wait, paced, pen, ovr, the
global g_local, g_open, g_closed, g_multi, g_conc and, after a reload,
gcra_new, fw2), its frame bounds (2048-byte frames, 128-byte keys, depth 8,
32 items) and its clock, where a request arrives `msgid` microseconds after
the frame before it.
"""

import os
import sys

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def write(target, name, data):
    if isinstance(data, str):
        data = data.encode()
    directory = os.path.join(HERE, "corpus", target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


# --- rpc: MessagePack-RPC byte streams -------------------------------------------

def pack(*values):
    return b"".join(msgpack.packb(v, use_bin_type=True) for v in values)


def req(msgid, method, params):
    return pack([0, msgid, method, params])


def note(method, params):
    return pack([2, method, params])


def rpc_seeds():
    seeds = {}
    # One request of every method and every params form.
    seeds["acquire_array"] = req(1, "acquire", ["tb", "user:1"])
    seeds["acquire_cost"] = req(2, "acquire", ["gcra", "user:1", 3])
    seeds["acquire_map"] = req(3, "acquire", [{"rule": "sw", "key": "k", "cost": 2}])
    seeds["acquire_bin_key"] = req(4, "acquire", ["fw", b"\x00bin\xffkey"])
    seeds["peek_array"] = req(5, "peek", ["sl", "user:1"])
    seeds["peek_map"] = req(6, "peek", [{"rule": "conc", "key": "k", "cost": 9}])
    seeds["release_array"] = req(7, "release", ["conc", "job", 1])
    seeds["release_map"] = req(8, "release", [{"rule": "conc_timed", "key": "job"}])
    seeds["acquire_all"] = req(9, "acquire_all", [[
        ["tb", "a"], ["gcra_multi", "a", 2], {"rule": "sl_big", "key": "a", "cost": 1},
        ["conc", "a"], ["shadow", "a"]]])
    seeds["health"] = req(10, "health", [])
    seeds["stats"] = req(11, "stats", [])
    seeds["rules"] = req(12, "rules", [])
    seeds["reload"] = req(13, "reload", [])
    seeds["unknown_method"] = req(14, "frobnicate", [1, [2, {"x": 3}]])
    seeds["notification_acquire"] = note("acquire", ["tb", "n"])
    seeds["notification_unknown"] = note("nope", [])
    seeds["empty"] = b""

    # Every algorithm until it denies, then after its period; msgid is the
    # step of the harness's clock in microseconds (0: the same instant).
    for rule, count, later_us in [("tb", 21, 1_000_000), ("tb_edge", 3, 4_000_000_000),
                                  ("gcra", 6, 100_000), ("gcra_multi", 101, 1_000_000),
                                  ("fw", 4, 50_000), ("fw_edge", 3, 4_000_000_000),
                                  ("sw", 11, 1_000_000), ("sw_edge", 3, 1_000),
                                  ("sl", 6, 200_000), ("sl_big", 3, 1_000_000),
                                  ("conc", 4, 1), ("conc_timed", 3, 500_000),
                                  ("shadow", 3, 3_600_000)]:
        frames = [req(0, "acquire", [rule, "hot"]) for _ in range(count)]
        frames.append(req(later_us, "acquire", [rule, "hot"]))
        frames.append(req(1, "peek", [rule, "hot"]))
        frames.append(req(1, "release", [rule, "hot", 1]))
        seeds["session_" + rule] = b"".join(frames)
    seeds["session_costs"] = b"".join([
        req(0, "acquire", ["tb", "c", 0]), req(0, "acquire", ["tb", "c", 20]),
        req(0, "acquire", ["tb", "c", 21]), req(0, "acquire", ["sl", "c", 1000000000]),
        req(0, "acquire", ["conc", "c", 3]), req(0, "release", ["conc", "c", 5]),
        req(0, "acquire", ["fw_edge", "c", 1000000000])])
    # Many keys: eviction at 32 keys, the 32 KiB byte cap with sl_big.
    seeds["session_many_keys"] = b"".join(
        req(i, "acquire", ["tb", "key%d" % i]) for i in range(40))
    seeds["session_big_state"] = b"".join(
        req(0, "acquire", ["sl_big", "k" * 120 + str(i)]) for i in range(6))
    # Reload: installs the second rule set (sl reshaped, gcra_new on tb's id),
    # is refused, installs the first again.
    seeds["session_reload"] = b"".join([
        req(0, "acquire", ["sl", "r"]), req(0, "acquire", ["tb", "r"]),
        req(0, "reload", []), req(1000, "peek", ["sl", "r"]), req(0, "acquire", ["sl", "r"]),
        req(0, "acquire", ["gcra_new", "r"]), req(0, "acquire", ["fw", "r"]),
        req(0, "acquire_all", [[["fw2", "r"], ["tb", "r"]]]), req(0, "rules", []),
        req(0, "reload", []), req(0, "reload", []), req(0, "acquire", ["tb", "r"]),
        req(0, "stats", [])])
    seeds["session_acquire_all_denied"] = b"".join([
        req(0, "acquire_all", [[["fw", "g"], ["fw", "g"], ["fw", "g"], ["fw", "g"]]]),
        req(0, "acquire_all", [[["conc", "g", 2], ["conc", "g", 2]]]),
        req(0, "acquire_all", [[["shadow", "g", 5], ["tb", "g"]]])])

    # Bounded waiting: the third acquire of "wait" (2/s) waits 500 ms for
    # its unit, a fourth asks to wait less than its turn and is refused, and
    # a later request moves the clock past the first's due time, so the
    # worker delivers its answer; "paced" lets one through each 100 ms.
    seeds["session_wait"] = b"".join([
        req(0, "acquire", ["wait", "w"]), req(0, "acquire", ["wait", "w"]),
        req(0, "acquire", ["wait", "w"]), req(0, "acquire", ["wait", "w", 1, 100]),
        req(0, "acquire", [{"rule": "wait", "key": "w", "cost": 1, "max_wait_ms": 0}]),
        req(0, "acquire", ["tb", "w", 1, 50]), req(600_000, "peek", ["wait", "w"])])
    seeds["session_paced"] = b"".join(
        [req(0, "acquire", ["paced", "p"]) for _ in range(6)] +
        [req(0, "acquire_all", [[["paced", "p"], ["tb", "p"]]]), req(250_000, "health", [])])
    # A stream that ends while requests wait, and one cut by a fatal frame.
    seeds["session_wait_stop"] = b"".join(req(0, "acquire", ["wait", "s"]) for _ in range(5))
    seeds["session_wait_fatal"] = (b"".join(req(0, "acquire", ["wait", "f"]) for _ in range(4))
                                   + b"\x94\x00\x2b\xa6health\x91\xc1")
    # Overrides: an exact key, a prefix, a glob and a key none matches; then
    # a reload gives "ovr" other overrides.
    seeds["session_overrides"] = b"".join(
        [req(0, "acquire", ["ovr", key, 15]) for key in ["vip", "pro:1", "x:free", "abc", "other"]]
        + [req(0, "peek", ["ovr", "pro:2"]), req(0, "reload", []),
           req(0, "acquire", ["ovr", "vip", 6]), req(0, "acquire", ["ovr", "abcd", 25])])
    # Penalty: three denials within the window block the key for 2 s; peek
    # and acquire_all see the block, reset lifts it, and it ends on its own.
    seeds["session_penalty"] = b"".join(
        [req(0, "acquire", ["pen", "bad"]) for _ in range(7)]
        + [req(0, "peek", ["pen", "bad"]), req(0, "acquire_all", [[["pen", "bad"], ["tb", "bad"]]]),
           req(0, "reset", ["pen", "bad"]), req(0, "acquire", ["pen", "bad"])]
        + [req(0, "acquire", ["pen", "bad"]) for _ in range(6)]
        + [req(2_100_000, "acquire", ["pen", "bad"])])
    # Global rules without Redis: the fallback share (half of each limit,
    # overrides and a penalty on it), policy open and closed, several limits
    # and concurrency, alone and in one acquire_all.
    seeds["session_global"] = b"".join(
        [req(0, "acquire", ["g_local", "k"]) for _ in range(8)]
        + [req(0, "acquire", ["g_local", "pro:k", 15]), req(0, "peek", ["g_local", "k"]),
           req(0, "reset", ["g_local", "k"]), req(0, "acquire", ["g_open", "k", 9]),
           req(0, "acquire", ["g_closed", "k"]), req(0, "release", ["g_closed", "k"])]
        + [req(0, "acquire", ["g_multi", "k"]) for _ in range(4)]
        + [req(0, "acquire", ["g_conc", "k"]) for _ in range(3)]
        + [req(0, "release", ["g_conc", "k", 2]),
           req(0, "acquire_all", [[["g_local", "a"], ["g_open", "a"], ["g_multi", "a"],
                                   ["g_conc", "a", 2], ["pen", "a"]]]),
           req(0, "acquire_all", [[["g_closed", "b"], ["g_conc", "b"]]]),
           req(1_000_000, "peek", ["g_multi", "k"]), req(0, "stats", []), req(0, "rules", [])])

    # Bad requests, each answered and read on after.
    seeds["bad_unknown_rule"] = req(20, "acquire", ["nope", "k"])
    seeds["bad_key_too_long"] = req(21, "acquire", ["tb", "k" * 129])
    seeds["bad_cost_negative"] = req(22, "acquire", ["tb", "k", -1])
    seeds["bad_cost_too_large"] = req(23, "acquire", ["tb", "k", 1000000001])
    seeds["bad_params_not_array"] = req(24, "acquire", {"rule": "tb"})
    seeds["bad_params_short"] = req(25, "acquire", ["tb"])
    seeds["bad_acquire_all_empty"] = req(26, "acquire_all", [[]])
    seeds["bad_acquire_all_too_many"] = req(27, "acquire_all", [[["tb", "k"]] * 33])
    seeds["bad_map_extra_and_repeat"] = pack(
        [0, 28, "acquire", [{"rule": "tb", "key": "a", "x": [1, 2], 7: "int key"}]])
    seeds["bad_msgid_too_large"] = req(2 ** 32, "acquire", ["tb", "k"])
    seeds["bad_msgid_negative"] = req(-1, "acquire", ["tb", "k"])
    seeds["bad_method_not_str"] = pack([0, 29, 5, []])
    seeds["bad_response_frame"] = pack([1, 30, None, None])
    seeds["bad_not_array"] = pack({"acquire": ["tb", "k"]}, "text", 42)
    seeds["bad_short_frame"] = pack([0, 31, "acquire"])
    seeds["bad_then_good"] = pack([0, 32, "acquire", ["tb"]]) + req(33, "acquire", ["tb", "k"])
    seeds["bad_max_wait"] = b"".join([
        req(34, "acquire", ["wait", "k", 1, 60001]), req(35, "acquire", ["wait", "k", 1, -1]),
        req(36, "acquire", ["sw", "k", 1, 100]), req(37, "acquire", ["g_multi", "k", 1, 100]),
        req(38, "reset", ["nope", "k"])])
    # Fatal: the stream cannot be read on (the rest is never answered).
    seeds["fatal_too_deep"] = pack([0, 40, "health", [[[[[[[[1]]]]]]]]]) + req(41, "health", [])
    seeds["fatal_frame_too_large"] = req(42, "acquire", ["tb", "k" * 2100])
    seeds["fatal_c1"] = b"\x94\x00\x2b\xa6health\x91\xc1" + req(44, "health", [])
    seeds["fatal_declared_huge"] = b"\x94\x00\x2d\xa7acquire\xdd\xff\xff\xff\xff"
    # Pipelined and cut off: whole frames, then half of one.
    whole = b"".join(req(i, m, p) for i, (m, p) in enumerate([
        ("acquire", ["tb", "p"]), ("peek", ["tb", "p"]), ("health", []),
        ("acquire_all", [[["gcra", "p"], ["sw", "p"]]])]))
    seeds["pipelined"] = whole
    seeds["truncated_after_frames"] = whole + req(9, "acquire", ["tb", "p"])[:7]
    seeds["truncated_header"] = b"\x94\x00\xcd"
    seeds["truncated_str"] = b"\x94\x00\x01\xa7acq"
    for name, data in seeds.items():
        write("rpc", name, data)


# --- config: TOML files -----------------------------------------------------------

CONFIGS = {
    "empty": "",
    "options": """
[daemon]
socket = "/tmp/s.sock"
socket_mode = "0600"
workers = 3
log_level = "debug"
[limits]
max_connections = 10
max_frame_bytes = 2048
max_key_bytes = 1024
max_depth = 8
max_items = 64
max_output_bytes = 8192
idle_timeout = "0"
partial_frame_timeout = "500ms"
[keys]
max_keys = 5
max_memory = 1_048_576
sweep_interval = "1m"
""",
    "every_algorithm": """
[[rule]]
name = "tb"
limit = 7
period = "1s"
burst = 20
[[rule]]
name = "g"
algorithm = "gcra"
limit = 10
period = "1h"
burst = 2
shadow = true
[[rule]]
name = "w"
algorithm = "fixed_window"
limit = 9
period = "1d"
[[rule]]
name = "s"
algorithm = "sliding_window"
limit = 300
period = "500ms"
[[rule]]
name = "l"
algorithm = "sliding_log"
limits = [{ limit = 20, period = "1h" }, { limit = 5, period = "1m" }]
[[rule]]
name = "c"
algorithm = "concurrency"
limit = 3
[[rule]]
name = "ct"
algorithm = "concurrency"
limit = 4
period = "10m"
""",
    "redis_global": """
[redis]
url = "redis://app:p%40ss@cache.local:6380/2"
expected_nodes = 12
lease_timeout = "20ms"
key_prefix = "rl:{eu}:"
node_id = "web-7"
health_interval = "50ms"
health_timeout = "300ms"
heartbeat_interval = "2s"
[[rule]]
name = "g"
limit = 5
period = "1s"
scope = "global"
on_redis_down = "closed"
[[rule]]
name = "o"
algorithm = "fixed_window"
limit = 100
period = "1m"
scope = "global"
on_redis_down = "open"
[[rule]]
name = "f"
algorithm = "concurrency"
limit = 10
scope = "global"
""",
    "redis_ipv6": '[redis]\nurl = "redis://:secret@[::1]:7000"\n',
    "redis_unix": '[redis]\nurl = "unix:///run/redis/redis.sock"\n',
    "redis_empty": "[redis]\n",
    "edges": """
[[rule]]
name = "big"
limit = 1000000000
period = "366d"
burst = 1000000000
[[rule]]
name = "fw"
algorithm = "fixed_window"
limit = 4294967295
period = "1ms"
[[rule]]
name = "sw"
algorithm = "sliding_window"
limit = 1048575
period = "1ms"
""",
    "policies": """
[[rule]]
name = "api"
limit = 100
period = "1m"
burst = 20
overrides = [
  { key = "partner", limit = 5000 },
  { prefix = "pro:", limit = 1000, burst = 200 },
  { glob = "*:free", limit = 10 },
]
[[rule]]
name = "login"
algorithm = "sliding_log"
limits = [{ limit = 20, period = "1h" }, { limit = 5, period = "1m" }]
penalty = { denials = 10, window = "10m", block = "1h" }
[[rule]]
name = "pay"
algorithm = "gcra"
limit = 10
period = "1s"
pace = true
max_wait = "2s"
[[rule]]
name = "w"
limit = 5
period = "1s"
max_wait = "250ms"
""",
    "global_policies": """
[redis]
url = "redis://127.0.0.1:6379"
lease_ttl = "3s"
[[rule]]
name = "g"
limit = 100
period = "1s"
scope = "global"
overrides = [{ prefix = "pro:", limit = 1000 }]
penalty = { denials = 5, window = "1m", block = "10m" }
max_wait = "1s"
[[rule]]
name = "m"
algorithm = "sliding_window"
limits = [{ limit = 100, period = "1s" }, { limit = 5000, period = "1h" }]
scope = "global"
[[rule]]
name = "c"
algorithm = "concurrency"
limit = 10
scope = "global"
on_redis_down = "closed"
""",
    "sentinel": """
[redis]
sentinel_master = "mymaster"
sentinels = ["10.0.0.1:26379", "[::1]:26380", "sentinel-3:26379"]
sentinel_username = "watcher"
sentinel_password = "s3cret"
username = "app"
password = "p"
[[rule]]
name = "g"
limit = 5
period = "1s"
scope = "global"
""",
    "cluster": """
[redis]
cluster_nodes = ["127.0.0.1:7000", "127.0.0.1:7001", "[::1]:7002"]
password = "p"
[[rule]]
name = "g"
algorithm = "gcra"
limit = 50
period = "1s"
scope = "global"
""",
    # Refused files, one per kind of refusal.
    "bad_unknown_key": "[limits]\nmax_conections = 5\n",
    "bad_unknown_section": "[limit]\nmax_depth = 4\n",
    "bad_option_outside_section": "workers = 2\n",
    "bad_section_not_table": "daemon = 1\n",
    "bad_rule_single_table": '[rule]\nname = "r"\n',
    "bad_type": '[limits]\nmax_connections = "10"\n',
    "bad_duration": '[limits]\nidle_timeout = "10 sec"\n',
    "bad_duration_huge": '[[rule]]\nname = "r"\nlimit = 5\nperiod = "99999999999999999999d"\n',
    "bad_below_minimum": "[limits]\nmax_connections = 0\n",
    "bad_frame_smaller_than_key": "[limits]\nmax_frame_bytes = 2048\nmax_key_bytes = 2000\n",
    "bad_socket_mode": '[daemon]\nsocket_mode = "0968"\n',
    "bad_toml": "[daemon]\nworkers = = 2\n",
    "bad_toml_unterminated": '[daemon]\nsocket = "/run/x\n',
    "bad_duplicate_rule": '[[rule]]\nname = "api"\nlimit = 1\nperiod = "1s"\n'
                          '[[rule]]\nname = "api"\nlimit = 2\nperiod = "1s"\n',
    "bad_rule_name_control": '[[rule]]\nname = "a\\tb"\n',
    "bad_limit_above_max": '[[rule]]\nname = "r"\nalgorithm = "sliding_log"\nlimit = 5000\n'
                           'period = "1s"\n',
    "bad_burst_window": '[[rule]]\nname = "r"\nalgorithm = "fixed_window"\nlimit = 5\n'
                        'period = "1s"\nburst = 2\n',
    "bad_burst_span": '[[rule]]\nname = "r"\nlimit = 10\nperiod = "1d"\nburst = 1000000\n',
    "bad_limits_same_period": '[[rule]]\nname = "r"\nlimits = [{ limit = 1, period = "1s" }, '
                              '{ limit = 2, period = "1000ms" }]\n',
    "bad_concurrency_two_limits": '[[rule]]\nname = "r"\nalgorithm = "concurrency"\n'
                                  'limits = [{ limit = 1 }, { limit = 2 }]\n',
    "bad_global_without_redis": '[[rule]]\nname = "r"\nlimit = 5\nperiod = "1s"\n'
                                'scope = "global"\n',
    "bad_redis_url_port": '[redis]\nurl = "redis://cache:99999"\n',
    "bad_redis_url_password": '[redis]\nurl = "redis://app:hunter2@cache:0"\n',
    "bad_invalid_utf8": b'[daemon]\nlog_level = "\xff\xfe"\n',
    "bad_pace_with_burst": '[[rule]]\nname = "r"\nlimit = 5\nperiod = "1s"\nburst = 2\n'
                           'pace = true\n',
    "bad_max_wait_window": '[[rule]]\nname = "r"\nalgorithm = "fixed_window"\nlimit = 5\n'
                           'period = "1s"\nmax_wait = "1s"\n',
    "bad_override_no_match": '[[rule]]\nname = "r"\nlimit = 5\nperiod = "1s"\n'
                             'overrides = [{ limit = 10 }]\n',
    "bad_penalty_global_concurrency": '[redis]\nurl = "redis://h"\n[[rule]]\nname = "r"\n'
                                      'algorithm = "concurrency"\nlimit = 5\nscope = "global"\n'
                                      'penalty = { denials = 1, window = "1s", block = "1s" }\n',
    "bad_sentinel_and_url": '[redis]\nurl = "redis://h"\nsentinel_master = "m"\n'
                            'sentinels = ["h:26379"]\n',
}


def config_seeds():
    with open(os.path.join(ROOT, "conf", "sluice.toml"), "rb") as f:
        write("config", "conf_sluice_toml", f.read())
    for name, text in CONFIGS.items():
        write("config", name, text)


# --- lease_reply: RESP answers of Redis ---------------------------------------------

def resp(value):
    """RESP as Redis writes it: int, bytes/str (bulk), None (nil), list, or
    ('+', text) / ('-', text) for status and error replies."""
    if isinstance(value, tuple):
        return value[0].encode() + value[1].encode() + b"\r\n"
    if value is None:
        return b"$-1\r\n"
    if isinstance(value, int):
        return b":%d\r\n" % value
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, bytes):
        return b"$%d\r\n%s\r\n" % (len(value), value)
    return b"*%d\r\n" % len(value) + b"".join(resp(v) for v in value)


NOW_MS = 1_700_000_000_000

REPLIES = {
    "lease_granted": [5, 95, 0, 1000, NOW_MS],
    "lease_empty": [0, 0, 250, 1000, NOW_MS],
    "lease_never": [0, 10, -1, 0, NOW_MS],
    "lease_concurrency": [2, 1, 0, 0, NOW_MS, 3],
    "lease_extremes": [2 ** 63 - 1, -(2 ** 63), -(2 ** 63), 2 ** 63 - 1, 0, -1],
    "lease_too_short": [1, 2, 3, 4],
    "lease_too_long": [1, 2, 3, 4, 5, 6, 7],
    "lease_strings": ["5", "95", "0", "1000", str(NOW_MS)],
    "lease_nil_element": [5, None, 0, 1000, NOW_MS],
    "lease_nested": [[5, 95], 0, 1000, NOW_MS, [[[1]]]],
    "heartbeat": [3, NOW_MS],
    "heartbeat_zero_live": [0, NOW_MS],
    "empty_array": [],
    "nil": None,
    "integer": 42,
    "bulk": "OK",
    "status": ("+", "OK"),
    "noscript": ("-", "NOSCRIPT No matching script. Please use EVAL."),
    "script_error": ("-", "ERR Error running script (call to f_0123): @user_script:12: bad"),
}


def lease_reply_seeds():
    for name, value in REPLIES.items():
        write("lease_reply", name, resp(value))
    write("lease_reply", "nil_array", b"*-1\r\n")
    write("lease_reply", "pipelined",
          resp([3, NOW_MS]) + resp(REPLIES["lease_granted"]) + resp(("-", "ERR x")))
    write("lease_reply", "truncated", resp(REPLIES["lease_granted"])[:11])
    write("lease_reply", "protocol_error", b"?what\r\n")
    write("lease_reply", "array_huge", b"*500000000\r\n:1\r\n")
    write("lease_reply", "array_out_of_range", b"*-5\r\n*4294967297\r\n")
    write("lease_reply", "integer_overflow", b"*2\r\n:99999999999999999999\r\n:-x\r\n")
    deep = 1
    for _ in range(7):
        deep = [deep]
    write("lease_reply", "deepest", resp(deep))
    write("lease_reply", "too_deep", resp([deep]))


# --- resp: Redis clients' byte streams to the Redis protocol front ----------------

def resp_command(*words):
    words = [w if isinstance(w, bytes) else str(w).encode() for w in words]
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)


def resp_seeds():
    write("resp", "throttle", resp_command("CL.THROTTLE", "user:42", 15, 30, 60, 1))
    write("resp", "pipeline", b"".join([
        resp_command("HELLO", 3), resp_command("CLIENT", "SETINFO", "lib-name", "x"),
        resp_command("SELECT", 0), resp_command("SLUICE.ACQUIRE", "api", "k", 2),
        resp_command("SLUICE.PEEK", "api", "k"), resp_command("ECHO", b"\x00\r\n"),
        resp_command("PING")]))
    write("resp", "inline", b"PING\r\nECHO  hi \r\nCL.THROTTLE k 0 1 1 0\nQUIT\r\n")
    write("resp", "errors", resp_command("CL.THROTTLE", "k", -1, 0, 0, "x") +
          resp_command("GET", "x") + resp_command("SLUICE.ACQUIRE", "a"))
    write("resp", "bad_length", b"*1\r\n$99999999\r\n")
    write("resp", "bad_multibulk", b"*-3\r\n")
    write("resp", "partial", resp_command("CL.THROTTLE", "k", 1, 2, 3)[:-5])


# --- http: HTTP clients' byte streams to the HTTP check front ----------------------

def http_seeds():
    host = b"Host: sluice\r\n"
    write("http", "check", b"GET /v1/check?rule=api&key=user%3A42&cost=2 HTTP/1.1\r\n" + host +
          b"\r\n")
    write("http", "pipeline", b"".join([
        b"GET /v1/check?rule=api&key=a HTTP/1.1\r\n" + host + b"\r\n",
        b"POST /v1/peek HTTP/1.1\r\n" + host +
        b"Sluice-Rule: api\r\nSluice-Key: b\r\nContent-Length: 4\r\n\r\nbody",
        b"GET /v1/check?rule=api&key_header=X-Forwarded-For HTTP/1.1\r\n" + host +
        b"X-Forwarded-For: 1.2.3.4, 10.0.0.1\r\n\r\n",
        b"POST /v1/reserve?rule=api&key=c&estimate=10&ttl_ms=500 HTTP/1.1\r\n" + host + b"\r\n",
        b"POST /v1/settle?id=281474976710659&actual=0 HTTP/1.1\r\n" + host +
        b"Connection: close\r\n\r\n"]))
    write("http", "http10", b"\r\nGET /v1/check?rule=a+b&key=%zz HTTP/1.0\n"
          b"Connection: keep-alive\n\nHEAD /v1/check HTTP/1.0\n\n")
    write("http", "errors", b"DELETE /v1/check?rule=api&key=k HTTP/1.1\r\n" + host + b"\r\n"
          b"GET /v2 HTTP/1.1\r\n" + host + b"\r\n"
          b"GET /v1/check?rule=api&key=k&cost=-1 HTTP/1.1\r\n" + host + b"\r\n"
          b"GET /v1/check HTTP/1.1\r\nBad Name: x\r\n\r\n")
    write("http", "chunked", b"POST /v1/check HTTP/1.1\r\n" + host +
          b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    write("http", "too_long", b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n")
    write("http", "partial", b"GET /v1/check?rule=api&key=k HTTP/1.1\r\nHost: s")


def main():
    rpc_seeds()
    resp_seeds()
    http_seeds()
    config_seeds()
    lease_reply_seeds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
