"""What a profiled window costs a GPU step: the decode-like step of the gpu test
(tests/domain/test_step_breakdown_gpu.py: vLLM 0.34's fused MoE, flash attention, an RMSNorm,
a one-rank NCCL all-reduce and a 0.5 ms host pause) timed unprofiled, then under the torch
profiler recording CUDA kernels only and CPU ops with them (vLLM's default). On a GPU host:

    python bench/step_profile_gpu.py

Prints the median step (ms) of each and the ratio to unprofiled; target ≤ 1.2× kernels only.
"""

import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.domain.test_step_breakdown_gpu import (  # noqa: E402
    build_parts,
    halves,
    join_one_rank,
    run_steps,
)

ACTIVITIES = {
    "kernels only": [torch.profiler.ProfilerActivity.CUDA],
    "CPU ops and kernels": [
        torch.profiler.ProfilerActivity.CPU,
        torch.profiler.ProfilerActivity.CUDA,
    ],
}


def main():
    join_one_rank()
    first, second = halves(build_parts())

    def step_ms(activities=None):
        # five windows each, the median of their medians: one window's clocks do not decide it
        medians = []
        for _ in range(5):
            if activities is None:
                medians.append(run_steps(first, second))
                continue
            with torch.profiler.profile(activities=activities):
                medians.append(run_steps(first, second))
        return statistics.median(medians)

    step_ms()
    base = step_ms()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| window | median step, ms | × unprofiled |\n| --- | --- | --- |")
    print(f"| none | {base:.3f} | 1.00 |")
    for name, activities in ACTIVITIES.items():
        ms = step_ms(activities)
        print(f"| {name} | {ms:.3f} | {ms / base:.2f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
