"""One tune spread over every GPU of the host against the same tune on one GPU, in one device call.

GLM-5 at TP8 in bf16 (E=256, N=256, H=6144, top-8), the 18 batch sizes: first on GPU 0 alone,
then over all GPUs (tuning.spread: one process per GPU, CUDA_VISIBLE_DEVICES pinned, the first
rounds compiled once for the host by its precompile), each phase with an empty Triton cache so
that both compile from scratch; --without-precompile adds both phases again with each process
compiling for itself (as before issue 9). NVML telemetry of every GPU (workers.telemetry) runs
throughout; the topology probe (`python -m workers.topology probe`) runs first and is compared
with the one-GPU H200 host's (results/h200_topology_probe.json).
Prints wall times and the speedup, each GPU's share and finish time, where the seconds went per
phase and process (the precompile's start-up and compiling; per GPU set-up, waiting for the
precompile, tuning and the compiling in it), telemetry per phase and GPU, and the tuned µs of
the first two phases side by side.

    python3 bench/spread_device.py --out "$OUT" [--without-precompile]

Writes topology.json, telemetry.jsonl and results.json under --out.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuning.config_files import TUNED_BATCH_SIZES  # noqa: E402
from tuning.search import KernelShape  # noqa: E402
from tuning.spread import (  # noqa: E402
    DEFAULT_PRECOMPILE_FUNCTION,
    NVLS_OFF,
    expected_cost,
    parse_gpus,
    share_batch_sizes,
    spread_tune,
)
from workers.telemetry import TelemetrySampler  # noqa: E402
from workers.topology import diff_snapshots  # noqa: E402

GLM5_TP8_BF16 = KernelShape(E=256, N=256, H=6144, top_k=8)
ONE_GPU_HOST_PROBE = ROOT / "bench" / "results" / "h200_topology_probe.json"
NO_PRECOMPILE = ", no precompile"


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


def tune_phase(name: str, gpus: tuple[int, ...], precompile_function: str | None) -> dict:
    """The 18-size tune spread over gpus, from an empty Triton cache; its figures."""
    finished: dict[str, float] = {}
    reported = [0]
    with tempfile.TemporaryDirectory() as work:
        # each phase compiles from scratch, as on a fresh host
        os.environ["TRITON_CACHE_DIR"] = str(Path(work) / "triton-cache")
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
            precompile_function=precompile_function,
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


def timeline_figures(timeline) -> dict:
    """A tuning.spread.SpreadTimeline as JSON: the precompile's seconds and counts, and per GPU
    its process's phases (s). The precompile's setup_s is its start-up before compiling."""
    precompile = timeline.precompile
    figures = {"precompile": None, "processes": {}}
    if precompile is not None:
        figures["precompile"] = {
            "setup_s": round(precompile.wall_s - precompile.compile_s, 2),
            "compile_s": round(precompile.compile_s, 2),
            "wall_s": round(precompile.wall_s, 2),
            "configs": len(precompile.configs),
            "failed": sum(error is not None for error in precompile.errors),
            "error": precompile.error,
        }
    for index, process in sorted(timeline.processes.items()):
        phases = {key: round(value, 2) for key, value in asdict(process).items()}
        phases["wall_s"] = round(process.setup_s + process.wait_s + process.tune_s, 2)
        figures["processes"][f"GPU {index}"] = phases
    return figures


def timeline_table(phases: list[dict]) -> list[str]:
    """Per phase a row for the precompile and one per GPU process: seconds of set-up, waiting
    for the precompile, compiling (within tune for the GPUs), tuning and in all."""
    lines = [
        f"  {'phase':22} {'process':10} {'setup':>7} {'wait':>7} {'compile':>8}"
        f" {'tune':>7} {'wall':>7}"
    ]

    def cell(value) -> str:
        return f"{value:7.1f}" if value is not None else f"{'-':>7}"

    for phase in phases:
        precompile = phase["timeline"]["precompile"]
        if precompile is not None:
            note = f"  {precompile['configs']} configs, {precompile['failed']} failed"
            if precompile["error"]:
                note += f", error: {precompile['error']}"
            lines.append(
                f"  {phase['name']:22} {'precompile':10} {cell(precompile['setup_s'])}"
                f" {cell(None)} {precompile['compile_s']:8.1f} {cell(None)}"
                f" {cell(precompile['wall_s'])}{note}"
            )
        for gpu, process in phase["timeline"]["processes"].items():
            lines.append(
                f"  {phase['name']:22} {gpu:10} {cell(process['setup_s'])}"
                f" {cell(process['wait_s'])} {process['compile_s']:8.1f}"
                f" {cell(process['tune_s'])} {cell(process['wall_s'])}"
            )
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
            f"  {phase['name']:8} GPU{index}: n={len(mine):3}"
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
        "--without-precompile",
        action="store_true",
        help="then both phases again with each process compiling for itself (an A/B)",
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
    planned = [
        ("1 GPU", (0,), DEFAULT_PRECOMPILE_FUNCTION),
        (f"{len(every_gpu)} GPUs", every_gpu, DEFAULT_PRECOMPILE_FUNCTION),
    ]
    if args.without_precompile:
        planned += [(name + NO_PRECOMPILE, gpus, None) for name, gpus, _ in planned]
    phases = []
    try:
        for name, gpus, precompile_function in planned:
            log(f"{name}: tuning GLM-5 TP8 bf16, {len(TUNED_BATCH_SIZES)} sizes on {list(gpus)}")
            try:
                phases.append(tune_phase(name, gpus, precompile_function))
                log(f"{name}: {phases[-1]['wall_s']} s")
            except Exception:
                log(f"{name} failed:\n{traceback.format_exc()}")
            (out / "results.json").write_text(json.dumps({"phases": phases}, indent=1))
    finally:
        sampler.stop()
    samples = sampler.drain()
    (out / "telemetry.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))

    print("\n== wall time of the 18-size tune ==")
    for phase in phases:
        print(f"  {phase['name']:22} {phase['wall_s']:7.1f} s  on {phase['device_name']}")
    by_name = {phase["name"]: phase for phase in phases}
    for suffix in ("", NO_PRECOMPILE):
        one, spread = by_name.get("1 GPU" + suffix), by_name.get(f"{len(every_gpu)} GPUs" + suffix)
        if one and spread:
            speedup = one["wall_s"] / spread["wall_s"]
            ideal = len(spread["gpus"])
            print(
                f"  speedup{suffix} {speedup:.2f}x of an ideal {ideal}x"
                f" ({100 * speedup / ideal:.0f} %)"
            )
    print("\n== where the seconds went, per phase and process (s) ==")
    print("\n".join(timeline_table(phases)))
    if len(phases) >= 2:
        one, spread = phases[:2]
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
