"""Step breakdowns and profile bodies built by hand (domain.step_breakdown), for the web tier's
tests of profiled levels: shares per class, the rest of a step left to "other"."""

from domain.step_breakdown import CLASSES, LevelProfile, StepBreakdown

DECODE_US = 20_000.0


def kind(name="decode", shares=None, steps=40, step_us=DECODE_US, top=None):
    """A KindBreakdown's dict: `shares` {class: 0–1}, "other" takes what they leave; `top`
    {class: [(name, µs)]}."""
    shares = dict(shares or {"moe": 0.3, "attention": 0.2, "communication": 0.12, "gemm": 0.2})
    shares.setdefault("other", max(0.0, 1 - sum(shares.values())))
    top = top or {}
    return {
        "kind": name,
        "steps": steps,
        "step_us_median": step_us,
        "step_us_p10": step_us * 0.9,
        "step_us_p90": step_us * 1.2,
        "classes": [
            {
                "name": c,
                "time_us": shares.get(c, 0.0) * step_us,
                "share": shares.get(c, 0.0),
                "top": [{"name": n, "time_us": us} for n, us in top.get(c, [])],
            }
            for c in CLASSES
        ],
    }


def breakdown(ranks=2, kinds=None, notes=(), steps=True):
    """A StepBreakdown of `ranks` ranks, each with the same kinds (default one decode kind)."""
    kinds = kinds or [kind()]
    return StepBreakdown.model_validate(
        {
            "engine": "vllm",
            "engine_version": "0.32.0",
            "rules": "vllm 0.32",
            "notes": list(notes),
            "ranks": [
                {
                    "rank": r,
                    "file": f"rank{r}.pt.trace.json.gz",
                    "size_bytes": 1_000_000,
                    "device": "gpu",
                    "kinds": kinds,
                    "steps": [
                        {
                            "start_ms": i * 21.0,
                            "kind": k["kind"],
                            "wall_us": k["step_us_median"],
                            "prefill_tokens": 0 if k["kind"] == "decode" else 512,
                            "decode_tokens": 64,
                            "classes": {"moe": 6000.0},
                        }
                        for i, k in enumerate(kinds * 3)
                    ]
                    if steps
                    else [],
                }
                for r in range(ranks)
            ],
        }
    )


def captured(concurrency=64, shares=None, attempt=1, **fields):
    """A captured LevelProfile body at `concurrency` whose decode steps have these shares."""
    body = {
        "concurrency": concurrency,
        "attempt": attempt,
        "status": "captured",
        "steps_asked": 40,
        "window_s": 1.9,
        "traces": [
            {
                "host": "h200-x8",
                "path": f"/var/moeops/profiles/rank{r}.json.gz",
                "size_bytes": 1_000_000,
            }
            for r in range(2)
        ],
        "cost": {"profiled_tok_s": 820.0, "unprofiled_tok_s": 1148.0, "ratio": 1.4},
        "breakdown": breakdown(kinds=[kind(shares=shares)]).model_dump(),
        **fields,
    }
    return LevelProfile.model_validate(body)


def unavailable(concurrency=64):
    return LevelProfile(
        concurrency=concurrency,
        status="unavailable",
        reason="the engine was not started with a profiler: start vLLM with --profiler-config",
        steps_asked=40,
    )
