"""What a profiled window costs the real vLLM CPU build's decode step (tests/engine: the tiny MoE
at TP 1, started with the torch profiler as moeops asks, no stacks): the level's TPOT unprofiled
(median of its rounds) against the decode step the window recorded (its median), and the profiled
pass's output throughput against the rounds'.

    .venv/bin/python bench/step_profile_cpu.py [--concurrency 4] [--rounds 3] [--steps 40]
"""

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from domain.launch import PROFILER_FLAG, profiler_flag_value  # noqa: E402
from domain.step_breakdown import LevelProfile  # noqa: E402
from tests.engine import SERVED_MODEL, VOCAB_SIZE, VllmServer  # noqa: E402
from workers import loadgen, step_profile  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    level = loadgen.LevelConfig(
        concurrency=args.concurrency, input_len=64, output_len=64, num_prompts=16, warmup=4
    )
    with tempfile.TemporaryDirectory() as folder:
        server = VllmServer(
            log_path=Path(folder) / "server.log",
            extra_args=(PROFILER_FLAG, profiler_flag_value(folder)),
        ).start()
        try:
            server.wait()

            def client(seed):
                return loadgen.ClientConfig(
                    base_url=server.url, model=SERVED_MODEL, vocab_size=VOCAB_SIZE, seed=seed
                )

            rounds = [asyncio.run(loadgen.run_level(client(n), level)) for n in range(args.rounds)]
            tpot = statistics.median(r["median_tpot_ms"] for r in rounds)
            tok_s = statistics.median(r["output_throughput"] for r in rounds)
            profile = LevelProfile.model_validate(
                step_profile.profile_level(
                    client(1000), level, steps=args.steps, unprofiled_tok_s=tok_s
                )
            )
        finally:
            server.stop()
    if profile.breakdown is None:
        sys.exit(f"no breakdown: {profile.reason}")
    decode = profile.breakdown.ranks[0].kind("decode")
    step_ms = decode.step_us_median / 1e3
    print(f"vLLM {profile.breakdown.engine_version} CPU build, concurrency {args.concurrency}")
    print("| figure | unprofiled | profiled window | × |\n| --- | --- | --- | --- |")
    print(f"| decode step (TPOT), ms | {tpot:.2f} | {step_ms:.2f} | {step_ms / tpot:.2f} |")
    print(
        f"| the pass's output, tok/s | {tok_s:.0f} | {profile.cost.profiled_tok_s:.0f} | "
        f"{profile.cost.ratio:.2f} |"
    )
    print(f"({decode.steps} decode steps in the window of {args.steps})")


if __name__ == "__main__":
    main()
