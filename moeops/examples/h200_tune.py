"""One kernel tune of moeops' own, beside the write-up's figures, so that the kernel pages show
what a tune records: GLM-5 TP8 (E=256, N=256, hidden 6144, top-8) fp8 block [128, 128] on one
NVIDIA H200, tuned in vLLM 0.33.0's own fused-MoE kernel by `bench/engine_tune_device.py`
(bench/RESULTS.md). Per batch size it holds the written config and the tuner's timings of it, of
vLLM's default config and of the entry of vLLM's shipped H200 file, with which of them was
written. The file h200_vllm_glm5_fp8_block_tune.json is that run's tune, as its raw output had it.

Not write-up data: everything loaded here carries the file's provenance.
"""

import json
import uuid
from pathlib import Path

from django.db import transaction

from moeops.kernels.services import (
    kernel_config_store,
    tuning_run_create,
    tuning_run_update,
    tuning_timings_record,
)

TUNE_FILE = Path(__file__).resolve().parent / "h200_vllm_glm5_fp8_block_tune.json"
# one tuning run however often the examples are loaded (tuning_run_create returns it again)
TUNING_UUID = uuid.UUID("5d1f0e6c-4b1e-4f7e-9a53-0c2d7b1a9e01")
TIMING_FIELDS = (
    "tuned_us",
    "default_us",
    "shipped_us",
    "floor_us",
    "picked",
    "candidates_tried",
    "config",
)


@transaction.atomic
def load_h200_tune():
    """The tuned config and its tuning run with its timings; returns the tuning run. Loading it
    again changes nothing. The run names its GPU, not a host: the H200 it ran on is no host of
    this moeops (no worker takes work there)."""
    tune = json.loads(TUNE_FILE.read_text())
    provenance = tune["provenance"]
    shape, kernel, batches = tune["shape"], tune["kernel"], tune["batches"]
    # what the config and its tuning run both record: the GPU, the shape, the kernel timed
    recorded = {
        "device_name": tune["device_name"],
        "E": shape["E"],
        "N": shape["N"],
        "dtype": shape["dtype"],
        "block_shape": shape["block_shape"],
        "kernel_engine": kernel["engine"],
        "kernel_version": kernel["version"],
        "kernel_source_sha256": kernel["source_sha256"],
    }
    config, _ = kernel_config_store(
        triton_version=tune["triton_version"],
        entries={m: batch["config"] for m, batch in batches.items()},
        source="tuned",
        provenance=provenance,
        **recorded,
    )
    tuning, created = tuning_run_create(
        run_uuid=TUNING_UUID,
        hidden_size=shape["H"],
        topk=shape["top_k"],
        batch_sizes=sorted(int(m) for m in batches),
        engine=kernel["engine"],
        kernel_note=f"vLLM {kernel['version']}'s own kernel, read from its wheel",
        telemetry_status="not_collected",
        telemetry_detail="the benchmark kept no GPU telemetry of this tune",
        **recorded,
    )
    timings = [
        {"batch_size": int(m), **{key: batch[key] for key in TIMING_FIELDS}}
        for m, batch in batches.items()
    ]
    if created:
        # timings while it runs: a finished tune takes no more
        tuning_run_update(tuning_run=tuning, status="running")
        tuning_timings_record(tuning_run=tuning, timings=timings)
        tuning_run_update(
            tuning_run=tuning,
            status="succeeded",
            result=config,
            wall_s=tune["wall_s"],
        )
    else:
        # loaded before: the same figures again are a repeat
        tuning_timings_record(tuning_run=tuning, timings=timings)
    return tuning
