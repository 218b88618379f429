"""One tune spread over every GPU of the host against the same tune on one GPU, in one device call.

GLM-5 at TP8 in bf16 (E=256, N=256, H=6144, top-8), the 18 batch sizes: on GPU 0 alone, then
over all GPUs (tuning.spread: one process per GPU, CUDA_VISIBLE_DEVICES pinned), each from
empty caches (Triton's kernels, moeops's measured ceilings: a fresh host); then both again on
caches holding what those two compiled and measured (a host re-tuning a shape it tuned
before). NVML telemetry of every GPU (workers.telemetry) runs throughout; the topology probe
(`python -m workers.topology probe`) runs first and is compared with the one-GPU H200 host's
(results/h200_topology_probe.json).
Prints wall times and the speedup with a fresh and with a warm cache, each GPU's share and
finish time, where the seconds went per phase and process (set-up and its imports, CUDA
context and weights, the compile pool's start-up, tuning and the ceilings and compiling in
it), telemetry per phase and GPU, and the tuned µs of the two fresh phases side by side.

    python3 bench/spread_device.py --out "$OUT"

Writes topology.json, telemetry.jsonl and results.json under --out.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from domain.topology import diff_snapshots  # noqa: E402
from tuning.config_files import TUNED_BATCH_SIZES  # noqa: E402
from tuning.search import KernelShape  # noqa: E402
from tuning.spread import (  # noqa: E402
    NVLS_OFF,
    expected_cost,
    parse_gpus,
    share_batch_sizes,
    spread_tune,
)
from workers.telemetry import TelemetrySampler  # noqa: E402

GLM5_TP8_BF16 = KernelShape(E=256, N=256, H=6144, top_k=8)
ONE_GPU_HOST_PROBE = ROOT / "bench" / "results" / "h200_topology_probe.json"
WARM = ", warm cache"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def probe_topology(out: Path) -> None:
    probe = subprocess.run(
        [sys.executable, "-m", "workers.topology", "probe"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    (out / "topology.json").write_text(probe.stdout)
    if probe.returncode != 0:
        log(f"topology probe exited with {probe.returncode}: {probe.stderr.strip()[-500:]}")
        return
    snapshot = json.loads(probe.stdout)
    virt = snapshot["virtualization"]
    log(f"topology: {virt['kind']} ({virt['technology']}), driver {snapshot['driver_version']}")
    for gpu in snapshot["gpus"]:
        log(
            f"  GPU{gpu['index']} {gpu['name']} {gpu['pci_bus_id']}"
            f" nvlinks active {gpu['nvlinks_active']}"
        )
    for title, block in [("links", snapshot["links"]), ("p2p read", snapshot["p2p"]["read"])]:
        rows = (block or {}).get("matrix") or []
        log(f"  {title}: " + " | ".join(" ".join(map(str, row)) for row in rows))
    for line in diff_snapshots(json.loads(ONE_GPU_HOST_PROBE.read_text()), snapshot):
        log(f"  vs the one-GPU host: {line}")


def tune_phase(name: str, gpus: tuple[int, ...], cache: Path, compile_workers=None) -> dict:
    """The 18-size tune spread over gpus with Triton's cache and moeops's (the GPUs' ceilings)
    in cache; its figures. compile_workers: per GPU process (None: spread_tune's rule)."""
    finished: dict[str, float] = {}
    reported = [0]
    os.environ["TRITON_CACHE_DIR"] = str(cache / "triton")
    os.environ["MOEOPS_CACHE_DIR"] = str(cache / "moeops")
    with tempfile.TemporaryDirectory() as work:
        started_ts, started = time.time(), time.monotonic()

        def progress(done: int, total: int, message: str) -> None:
            if message.endswith(": done"):
                finished[message.split(":")[0]] = round(time.monotonic() - started, 1)
            if done - reported[0] >= 40 or message == "done":
                reported[0] = done
                log(f"  {name} {done}/{total} {message}")

        result = spread_tune(
            GLM5_TP8_BF16,
            TUNED_BATCH_SIZES,
            gpus,
            out_dir=Path(work) / "out",
            progress_callback=progress,
            compile_workers=compile_workers,
        )
        wall_s = time.monotonic() - started
        files = {p.name: p.read_text() for p in (Path(work) / "out").rglob("*.json")}
    shares = share_batch_sizes(TUNED_BATCH_SIZES, len(gpus))
    return {
        "name": name,
        "gpus": list(gpus),
        "wall_s": round(wall_s, 1),
        "window": [started_ts, time.time()],
        "shares": {f"GPU {i}": s for i, s in zip(gpus, shares, strict=True)},
        "expected_cost": {
            f"GPU {i}": round(sum(map(expected_cost, s)), 2)
            for i, s in zip(gpus, shares, strict=True)
        },
        "finished_s": finished,
        "timeline": timeline_figures(result.timeline),
        "device_name": result.device_name,
        "batches": {
            m: {"tuned_us": b.tuned_us, "default_us": b.default_us, "config": b.config}
            for m, b in sorted(result.batches.items())
        },
        "config_files": files,
    }


def timeline_figures(timeline: dict) -> dict:
    """A spread tune's timeline ({GPU index: ProcessTimeline}) as JSON: per GPU its process's
    phases (s); wall_s is set-up plus tune (the pool's start-up overlaps them)."""
    figures = {}
    for index, process in sorted(timeline.items()):
        phases = {key: round(value, 2) for key, value in asdict(process).items()}
        phases["wall_s"] = round(process.setup_s + process.tune_s, 2)
        figures[f"GPU {index}"] = phases
    return figures


TIMELINE_COLUMNS = [
    ("setup", "setup_s"),
    ("import", "import_s"),
    ("cuda", "cuda_s"),
    ("weights", "weights_s"),
    ("pool start", "pool_start_s"),
    ("tune", "tune_s"),
    ("ceilings", "ceilings_s"),
    ("compile", "compile_s"),
    ("wall", "wall_s"),
]


def timeline_table(phases: list[dict]) -> list[str]:
    """Per phase a row per GPU process: seconds of set-up (import, CUDA context and weights
    within it), of the compile pool's start-up (from early in the set-up), of tuning (measuring
    the ceilings and compiling within it) and in all."""
    lines = [f"  {'phase':22} {'process':8} " + " ".join(f"{t:>10}" for t, _ in TIMELINE_COLUMNS)]
    for phase in phases:
        for gpu, process in phase["timeline"].items():
            figures = " ".join(f"{process.get(key, 0.0):10.1f}" for _, key in TIMELINE_COLUMNS)
            lines.append(f"  {phase['name']:22} {gpu:8} {figures}")
    return lines


def telemetry_summary(phase: dict, samples: list[dict]) -> list[str]:
    start, end = phase["window"]
    lines = []
    for index in sorted({s["gpu_index"] for s in samples}):
        mine = [s for s in samples if s["gpu_index"] == index and start <= s["ts"] <= end]

        def values(key, mine=mine):
            return [s[key] for s in mine if s[key] is not None] or [float("nan")]

        util, power, memory = values("gpu_util"), values("power_w"), values("mem_used_mib")
        lines.append(
            f"  {phase['name']:22} GPU{index}: n={len(mine):3}"
            f"  util mean {sum(util) / len(util):5.1f} % max {max(util):5.1f} %"
            f"  power mean {sum(power) / len(power):6.1f} W"
            f" max {max(power):6.1f} W  mem max {max(memory):8.0f} MiB"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "spread-device"))
    parser.add_argument("--hz", type=float, default=2.0, help="telemetry samples/s per GPU")
    parser.add_argument(
        "--compile-workers", type=int, help="compile processes per GPU process (default: rule)"
    )
    parser.add_argument(
        "--only-spread", action="store_true", help="skip the one-GPU phases (compare by hand)"
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.update(NVLS_OFF)

    probe_topology(out)
    every_gpu = parse_gpus("all")
    log(f"{len(every_gpu)} GPUs; {os.cpu_count()} CPUs")
    sampler = TelemetrySampler(None, hz=args.hz).start()
    log(f"telemetry: {sampler.status} {sampler.detail}")
    fresh = [("1 GPU", (0,)), (f"{len(every_gpu)} GPUs", every_gpu)]
    runs = fresh[1:] if args.only_spread else fresh
    planned = [*runs, *((name + WARM, gpus) for name, gpus in runs)]
    phases = []
    try:
        with tempfile.TemporaryDirectory() as caches:
            warm_cache = Path(caches) / "warm"
            for number, (name, gpus) in enumerate(planned):
                is_warm = name.endswith(WARM)
                cache = warm_cache if is_warm else Path(caches) / f"fresh-{number}"
                log(f"{name}: GLM-5 TP8 bf16, {len(TUNED_BATCH_SIZES)} sizes on {list(gpus)}")
                try:
                    phases.append(tune_phase(name, gpus, cache, args.compile_workers))
                    log(f"{name}: {phases[-1]['wall_s']} s")
                except Exception:
                    log(f"{name} failed:\n{traceback.format_exc()}")
                if not is_warm and cache.exists():
                    # the warm phases find every kernel either fresh phase compiled
                    shutil.copytree(cache, warm_cache, dirs_exist_ok=True)
                (out / "results.json").write_text(json.dumps({"phases": phases}, indent=1))
    finally:
        sampler.stop()
    samples = sampler.drain()
    (out / "telemetry.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))

    print("\n== wall time of the 18-size tune ==")
    for phase in phases:
        print(f"  {phase['name']:22} {phase['wall_s']:7.1f} s  on {phase['device_name']}")
    by_name = {phase["name"]: phase for phase in phases}
    one_name, spread_name = (name for name, _ in fresh)
    for label, suffix in (("fresh cache", ""), ("warm cache", WARM)):
        one, spread = by_name.get(one_name + suffix), by_name.get(spread_name + suffix)
        if one and spread:
            speedup = one["wall_s"] / spread["wall_s"]
            ideal = len(spread["gpus"])
            print(
                f"  speedup, {label}: {speedup:.2f}x of an ideal {ideal}x"
                f" ({100 * speedup / ideal:.0f} %)"
            )
    for name in (one_name, spread_name):
        if name in by_name and name + WARM in by_name:
            saved = by_name[name]["wall_s"] - by_name[name + WARM]["wall_s"]
            print(f"  {name}: the warm cache saves {saved:.1f} s")
    print("\n== where the seconds went, per phase and process (s) ==")
    print("\n".join(timeline_table(phases)))
    one, spread = by_name.get(one_name), by_name.get(spread_name)
    if one and spread:
        print("\n== shares of the spread tune (expected cost, finished at s) ==")
        for gpu, share in spread["shares"].items():
            print(
                f"  {gpu}: {share}  cost {spread['expected_cost'][gpu]}"
                f"  finished {spread['finished_s'].get(gpu, 'n/a')} s"
            )
        print("\n== tuned µs: one GPU vs spread (different GPUs, separate searches) ==")
        for m in TUNED_BATCH_SIZES:
            a, b = one["batches"].get(m), spread["batches"].get(m)
            if a and b:
                same = "same config" if a["config"] == b["config"] else "other config"
                print(
                    f"  M={m:>5} {a['tuned_us']:9.1f} {b['tuned_us']:9.1f}"
                    f"  {b['tuned_us'] / a['tuned_us']:5.3f}  {same}"
                )
    print(f"\n== telemetry per phase and GPU ({len(samples)} samples) ==")
    for phase in phases:
        print("\n".join(telemetry_summary(phase, samples)))
    return 0 if len(phases) == len(planned) else 1


if __name__ == "__main__":
    sys.exit(main())
