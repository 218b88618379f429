"""A real sweep against the stand-in engine, capped below its top concurrency, diagnosed.

The sweep runs as a worker runs it (load generator, engine /metrics sampler, what the engine
says of itself) and its results are stored as the API stores them; the analysis must find the
plateau and the queue behind the cap the engine reported.
"""

import pytest

from domain.wire.levels import LEVEL_KEYS
from localstack.standin import spawn_standin
from moeops.fleet.models import Deployment, Host, ModelSpec
from moeops.insights import services
from moeops.runs.keys import level_key
from moeops.runs.models import LevelResult, SweepRun
from moeops.runs.samples import EngineSample
from workers.engine_info import identify_engine
from workers.engine_metrics import EngineMetricsSampler
from workers.loadgen import ClientConfig, SweepConfig, run_sweep

pytestmark = pytest.mark.django_db

CAP = 8
OUTPUT_LEN = 60
LEVELS = (4, 8, 16, 32)


@pytest.fixture(scope="module")
def capped_sweep():
    """(engine identity, level results, engine samples) of a sweep at 4…32 against a cap of 8."""
    # step = 12 ms + 0.5 ms × batch: throughput rises to the cap of 8, then stays. Each level
    # runs 5 s or more, so that a busy machine's pause of a few hundred ms in one level does
    # not read as a 10 % rise past the cap; and each request is long (about 1 s) beside the
    # client's turn-around from one request to the next, which a busy machine stretches and
    # which idles a slot at a concurrency equal to the cap but not above it (at 6 ms a step,
    # 8 -> 16 read over +10 % beside make check's three workers on 2 cores)
    url, proc = spawn_standin(
        ["--max-running-requests", str(CAP), "--step-ms-base", "12", "--step-ms-per-req", "0.5"]
    )
    try:
        identity = identify_engine(url)
        config = SweepConfig(
            client=ClientConfig(base_url=url, model="standin", vocab_size=32000),
            concurrencies=LEVELS,
            input_len=32,
            output_len=OUTPUT_LEN,
            prompts_per_level=48,
        )
        with EngineMetricsSampler(url, interval_s=0.05) as sampler:

            def tag(_, level):
                sampler.level_concurrency = level.concurrency

            results = run_sweep(config, on_level_start=tag)
    finally:
        proc.terminate()
        proc.wait(5)
    return identity, results, sampler.samples


def store(capped_sweep):
    identity, results, samples = capped_sweep
    model = ModelSpec.objects.create(name="standin", config_json={})
    host = Host.objects.create(name="standin-host")
    # the deployment records no cap: the one the rule uses is the engine's own
    deployment = Deployment.objects.create(name="standin", model=model, host=host, engine="other")
    run = SweepRun.objects.create(
        deployment=deployment,
        status="succeeded",
        telemetry_status="unavailable",
        parameters={"levels": list(LEVELS), "input_len": 32, "output_len": OUTPUT_LEN},
        snapshot={"engine": identity},
    )
    for result in results:
        fields = {k: result[k] for k in LEVEL_KEYS if result.get(k) is not None}
        LevelResult.objects.create(
            run=run,
            key=level_key(result["concurrency"], None),
            concurrency=result["concurrency"],
            started_at=result["started_at"],
            finished_at=result["finished_at"],
            raw=result,
            **fields,
        )
    EngineSample.objects.bulk_create(
        EngineSample(
            run=run,
            ts=s["ts"],
            level_concurrency=s["level_concurrency"],
            running=s["running"],
            queued=s["queued"],
        )
        for s in samples
    )
    return run


def test_a_capped_sweep_yields_the_plateau_and_queueing_findings(capped_sweep):
    run = store(capped_sweep)

    findings = {f.kind: f for f in services.run_analyze(run=run)}

    assert findings["plateau"].evidence["plateau_at"] == CAP
    queueing = findings["queueing"]
    assert queueing.severity == "warning" and queueing.evidence["basis"] == "engine_samples"
    assert queueing.evidence["cap"] == CAP
    assert queueing.evidence["cap_source"] == (
        "reported by the engine (/get_server_info max_running_requests)"
    )
    # no telemetry from the stand-in: no GPU evidence, never idle GPUs
    assert "idle_gpus" not in findings
    assert findings["other"].key == "no-gpu-evidence"
