"""What the tests share that is not a fixture of pytest's: the fixture files' folders, and the
fakes of what only a GPU host has (NVML's GPUs, the tuner's GPU measurements, an engine's HTTP
endpoints). Imports neither Django nor a GPU, so that the gpu-marked tests (run with
--noconftest) can use it too."""

import contextlib
import math
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from localstack.standin import StandinConfig, start_standin_in_thread
from tuning.compile_only import GpuTarget
from tuning.search import KernelShape, compile_key

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
HF_CONFIGS = FIXTURES / "hf_configs"
# GLM-5 at TP8, bf16: the tuner tests' shape
SHAPE = KernelShape(E=256, N=256, H=6144, top_k=8)
# the keys of a topology snapshot, whether parsed from files or probed on the host
TOPOLOGY_SNAPSHOT_KEYS = {
    "source",
    "virtualization",
    "driver_version",
    "cuda_version",
    "gpus",
    "links",
    "p2p",
    "affinity",
    "nics",
    "hostname",
}
# GLM-5's fused-MoE shape at TP8 in bf16 as a tune names it: 256 experts per rank, N = 2048 / 8
GLM5_TP8_TUNE = {
    "E": 256,
    "N": 256,
    "hidden_size": 6144,
    "topk": 8,
    "dtype": "bf16",
    "block_shape": None,
}
# One batch size's entry of a fused-MoE kernel-config file, as vLLM's benchmark_moe.py writes it
KERNEL_ENTRY = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}
# vLLM's own config files (vllm-project/vllm, fused_moe/configs/), kept in fixtures/kernel_configs
RTX_PRO_6000_FP8_FILE = (
    "E=128,N=2048,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition,"
    "dtype=fp8_w8a8,block_shape=[128,128].json"
)
MI300X_FILE = "E=128,N=1024,device_name=AMD_Instinct_MI300X.json"


def shared_prefix_spec(groups, prefix_len, question_len, output_len):
    """A shared-prefix workload's spec: `groups` prefixes of `prefix_len` tokens, each request's
    own question of `question_len`, and a fixed `output_len` asked for."""
    return {
        "kind": "shared_prefix",
        "groups": groups,
        "prefix_len": prefix_len,
        "question_len": question_len,
        "output": {"distribution": "fixed", "value": output_len},
    }


def python_module(module, *args, env=None, timeout=60):
    """`python -m module` run from the repository root with `args` (the finished process, its
    output captured); env: the whole environment (default: this process's)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def tuning_cli(*args):
    """`python -m tuning` with `args`, as python_module runs it."""
    return python_module("tuning", *args)


def compile_only_device(*args):
    """bench/compile_only_device.py run from the repository root with `args`: kernels compiled
    by processes that see no GPU, then launched on this GPU (the finished process, its output
    captured)."""
    return subprocess.run(
        [sys.executable, "bench/compile_only_device.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@contextlib.contextmanager
def standin_running(**config):
    """The stand-in engine (localstack.standin) serving StandinConfig(**config) on a free port
    of 127.0.0.1 while the block runs; yields its URL."""
    url, stop = start_standin_in_thread(StandinConfig(**config))
    try:
        yield url
    finally:
        stop()


@contextlib.contextmanager
def scripted_http_server(answer):
    """A real HTTP server on a free port of 127.0.0.1 whose every GET answers answer(path) →
    (status, body text[, delay s before answering]); yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            status, body, *delay = answer(self.path)
            time.sleep(delay[0] if delay else 0)
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """The pynvml functions the sampler calls, over scripted GPUs; counts init/shutdown."""

    NVMLError = FakeNVMLError
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, gpus, *, init_error=None, unsupported=()):
        self.gpus = gpus
        self.init_error = init_error
        self.unsupported = set(unsupported)
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self):
        if self.init_error:
            raise FakeNVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.gpus[index]

    def _get(self, name, handle):
        if name in self.unsupported:
            raise FakeNVMLError("Not Supported")
        return handle[name]

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self._get("util", handle)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self._get("memory", handle)

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._get("power_mw", handle)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self._get("limit_mw", handle)

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == self.NVML_CLOCK_SM
        return self._get("sm_clock", handle)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._get("temperature", handle)


def h200(util=0, power_mw=85_000):
    return {
        "util": SimpleNamespace(gpu=util, memory=util // 2),
        "memory": SimpleNamespace(used=96_000 * 2**20, total=143_771 * 2**20),
        "power_mw": power_mw,
        "limit_mw": 700_000,
        "sm_clock": 1980,
        "temperature": 41,
    }


def busy_h200_sample(ts, level_concurrency=None):
    """The telemetry sample taken at `ts` of h200(util=97, power_mw=612_345)."""
    return {
        "gpu_index": 0,
        "ts": ts,
        "level_concurrency": level_concurrency,
        "gpu_util": 97.0,
        "mem_util": 48.0,
        "power_w": pytest.approx(612.345),
        "power_limit_w": 700.0,
        "mem_used_mib": 96_000.0,
        "mem_total_mib": 143_771.0,
        "sm_clock_mhz": 1980.0,
        "temperature_c": 41.0,
    }


class FakeTimer:
    def __init__(self, measurements, M):
        self.measurements = measurements
        self.M = M

    def time_config(self, config, replays, calls=None, *, down_config=None):
        """GEMM 1 is fastest with 64-wide N tiles, GEMM 2 with 128 × 256 (N × K) tiles."""
        down_config = down_config or config
        self.measurements.timed.append((self.M, dict(config), replays))
        for c in (config, down_config):
            if c["BLOCK_SIZE_N"] == 256 and c["num_stages"] == 5:
                raise RuntimeError("out of resource: shared memory, Required: 262144")
        return self._gemm_us(config, 64, 128) + 0.5 * self._gemm_us(down_config, 128, 256)

    def _gemm_us(self, config, best_n, best_k):
        rows = max(1.0, self.M * 8 / 256)
        padding = math.ceil(rows / config["BLOCK_SIZE_M"]) * config["BLOCK_SIZE_M"] / rows
        tile = 1 + 0.2 * abs(math.log2(config["BLOCK_SIZE_N"] / best_n))
        tile += 0.1 * abs(math.log2(config["BLOCK_SIZE_K"] / best_k))
        return 10.0 * self.M**0.5 * padding * tile * (1 + 0.02 * abs(config["num_stages"] - 3))


class FakeMeasurements:
    """Synthetic µs; compiles fail for 8-warp BLOCK_SIZE_M 16 tiles, launches for some others."""

    device_name = "NVIDIA H200"
    triton_version = "3.6.0"
    target = GpuTarget(90, {"max_shared_mem": 232448})
    ceilings = {"bandwidth_tbps": 4.24, "bf16_tflops": 689.0, "fp8_tflops": None}
    pool_start_s = 2.5
    seconds = {"import_s": 1.5, "cuda_s": 0.75, "weights_s": 0.25, "ceilings_s": 1.25}

    def __init__(self):
        self.timed = []
        self.compiled = []
        self.closed = False

    def compile(self, configs, batch_sizes=(None,)):
        self.compiled += [compile_key(c) for c in configs]
        return [
            "CompilationError: too many registers"
            if c["BLOCK_SIZE_M"] == 16 and c["num_warps"] == 8
            else None
            for c in configs
        ]

    def start_compiles(self, configs, batch_sizes=(None,)):
        # compiled at once: the handles are the errors
        return self.compile(configs, batch_sizes)

    def finish_compiles(self, handles):
        return list(handles)

    def timer(self, M, routing=None):
        # the same synthetic µs under any routing
        return FakeTimer(self, M)

    def floor_us(self, M):
        return 5.0 * M**0.5

    def wait_for_compile_workers(self):
        return self.pool_start_s

    def close(self):
        self.closed = True
