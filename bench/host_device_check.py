"""On a GPU host: the topology probe, and NVML telemetry idle and under a bf16 matmul load.

Writes topology.json, telemetry_idle.jsonl and telemetry_load.jsonl into the folder given
(default: $OUT or ./host-check) and prints a short table. Needs torch with CUDA and pynvml.
`python bench/host_device_check.py [--out DIR] [--seconds 6]`
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path


def _sample(seconds, path):
    out = subprocess.run(
        [sys.executable, "-m", "workers.telemetry", "--seconds", str(seconds), "--hz", "2"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path.write_text(out)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _matmul_load(stop):
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()


def _summary(name, samples):
    def mean(key):
        values = [s[key] for s in samples if s.get(key) is not None]
        return sum(values) / len(values) if values else float("nan")

    print(
        f"{name:6} n={len(samples):3}  util {mean('gpu_util'):5.1f} %  "
        f"power {mean('power_w'):6.1f} / {mean('power_limit_w'):5.0f} W  "
        f"SM {mean('sm_clock_mhz'):6.0f} MHz  mem {mean('mem_used_mib'):8.0f} MiB  "
        f"temp {mean('temperature_c'):4.1f} C"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "host-check"))
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    probe = subprocess.run(
        [sys.executable, "-m", "workers.topology", "probe"], capture_output=True, text=True
    )
    (out / "topology.json").write_text(probe.stdout or probe.stderr)
    snapshot = json.loads(probe.stdout)
    print("virtualization:", json.dumps(snapshot["virtualization"]))
    print("driver", snapshot["driver_version"], "cuda", snapshot["cuda_version"])
    for gpu in snapshot["gpus"]:
        print("gpu:", json.dumps(gpu))
    print("links:", json.dumps(snapshot["links"]), "p2p:", json.dumps(snapshot["p2p"]))

    idle = _sample(args.seconds, out / "telemetry_idle.jsonl")
    stop = threading.Event()
    load = threading.Thread(target=_matmul_load, args=(stop,))
    load.start()
    time.sleep(2)  # let clocks and power settle under the load
    try:
        busy = _sample(args.seconds, out / "telemetry_load.jsonl")
    finally:
        stop.set()
        load.join()
    _summary("idle", idle)
    _summary("matmul", busy)


if __name__ == "__main__":
    main()
