"""Every tunable of the benchmark in one place, with its unit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
OUT_DIR = BENCH_DIR / "out"
RESULTS_MD = BENCH_DIR / "RESULTS.md"
PLOT_PATH = REPO_DIR / "docs" / "img" / "bench.png"

INVOCATION_HEADER = "X-Toolrelay-Invocation"  # what the worker sends; the upstream keys on it
API_KEY_HEADER = "X-Api-Key"
API_KEY_PREFIX = "Bearer "
API_KEY_SECRET = "sk-bench-0123456789abcdef0123456789abcdef"  # a dummy, loopback only
UPSTREAM_PATH = "/call"
UPSTREAM_HOST = "127.0.0.1"
TOOL_KEY = "bench.post"  # the dispatcher phases' tool: a POST, so each call is marked sent
# The agent path's: a read-only GET (issue 14, goal 1), the same upstream and credential.
READ_TOOL_KEY = "bench.get"
AGENT_NAME = "bench-agent"


def call_headers(invocation: str) -> dict[str, str]:
    """What toolrelay's worker sends with each call (the tool's api_key credential and the
    invocation id the upstream keys on); the raw client, the minimal loop and the
    procrastinate task send the same."""
    return {INVOCATION_HEADER: invocation, API_KEY_HEADER: f"{API_KEY_PREFIX}{API_KEY_SECRET}"}


CONCURRENCY = 64  # calls in flight: worker, raw client and peer worker alike
REQUEST_TIMEOUT_S = 30.0  # per call, for the raw client, the minimal loop and the peer
ENQUEUE_CHUNK = 5_000  # invocations per `SELECT fn_invoke_tool(...) FROM generate_series` statement
DB_PREFIX = "toolrelay_bench"  # fresh databases are named <prefix>_<hex>

PROCESS_START_TIMEOUT_S = 30.0  # a child that is not ready by then fails the run
DRAIN_TIMEOUT_S = 900.0  # a drain that takes longer than this fails the run
WORKER_READY_POLL_S = 0.05  # polling interval while waiting for workers to block on the gate
CHILD_POLL_S = 0.01  # polling interval of wait4(WNOHANG) on a child
NOISE_SAMPLE_S = 2.0  # idle sampling of the machine before and after the run
SETTLE_TIMEOUT_S = 30.0  # after a latency phase: wait at most this long for stragglers

GENERATOR_CONNECTIONS = 8  # connections creating invocations in the latency phase
LATENCY_RATES = (200, 1_000)  # invocations per second
LATENCY_WARMUP_S = 0.5  # at the first rate, before measuring: warms the upstream connections
LATENCY_PAUSE_S = 1.0  # between the two rates
INVOKE_THREADS = 8  # threads (each its own Registry / connection) in the invoke phase
SCALING_WORKERS = (1, 2, 4)  # worker processes

PROFILE_RATE_HZ = 200  # py-spy sampling rate
PROFILE_TOP = 25  # functions listed in the profile summary


@dataclass(frozen=True)
class Sizes:
    """What one mode measures."""

    throughput_n: int  # invocations in the throughput and scaling phases
    latency_seconds: float  # per rate
    memory_queued: int  # invocations queued for the memory phase
    invoke_seconds: float  # per variant of the invoke phase
    profile_n: int  # invocations drained under the profiler (0: no profile)
    # the 1,000/s latency rate, sustained (issue 14, goal 4: 60 s); 0: latency_seconds
    sustained_seconds: float = 0.0


FULL = Sizes(
    throughput_n=20_000,
    latency_seconds=20.0,
    memory_queued=100_000,
    invoke_seconds=10.0,
    profile_n=20_000,
    sustained_seconds=60.0,
)
QUICK = Sizes(
    throughput_n=1_000,
    latency_seconds=2.0,
    memory_queued=2_000,
    invoke_seconds=1.0,
    profile_n=0,
)

# Targets of issue #7 for the full run.
TARGET_VS_RAW = 0.5  # toolrelay throughput / raw aiohttp client
TARGET_VS_PEER = 5.0  # toolrelay throughput / procrastinate
TARGET_VS_FLOOR = 0.7  # toolrelay throughput / the minimal durable loop (issue 14, goal 4)
TARGET_PG_US = 150.0  # PostgreSQL CPU µs per call, toolrelay's throughput drain (goal 4)
TARGET_WORKER_US = 450.0  # worker CPU µs per call, the same drain (goal 4)
TARGET_P50_200_MS = 10.0  # creation -> request at the upstream, 200/s
TARGET_P99_200_MS = 50.0
TARGET_P99_1000_MS = 100.0  # creation -> request at the upstream, 1,000/s
TARGET_SCALE_2 = 1.3  # 2 workers / 1 worker
TARGET_RSS_MB = 200.0  # worker peak RSS with MEMORY_QUEUED queued
TARGET_INVOKE_PER_S = 3_000.0  # Registry.invoke from INVOKE_THREADS threads (issue 14)
SATURATED_CORES = 1.8  # of 2: the machine counts as saturated at or above this busy level
SATURATED_PROCESS = 0.9  # of one core: a single-loop process counts as CPU-bound
