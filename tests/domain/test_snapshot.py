"""A run's snapshot as both tiers read it (domain.snapshot)."""

import pytest

from domain.snapshot import RunSnapshot


def test_it_reads_an_imported_files_model_and_gpu_count():
    snapshot = RunSnapshot.read(
        {
            "source": "import",
            "deployment": {"engine": "sglang", "tp": 8},
            "file": {
                "file_name": "bench.jsonl",
                "format": "sglang-bench",
                "other_model": "Qwen/Qwen3-30B-A3B",
                "stated": {"gpu_count": 4},
            },
        }
    )

    assert snapshot.source == "import" and snapshot.deployment == {"engine": "sglang", "tp": 8}
    assert (snapshot.other_model, snapshot.stated_gpu_count) == ("Qwen/Qwen3-30B-A3B", 4)
    # what the model does not name is kept, for the run page's card
    assert snapshot.file.file_name == "bench.jsonl" and snapshot.file.format == "sglang-bench"
    # a run that did not answer has an empty engine, not None: callers read its keys
    assert snapshot.engine == {} and snapshot.kernel_config is None and snapshot.recipe is None


@pytest.mark.parametrize("snapshot", [None, {}, [], "snapshot"])
def test_a_run_without_a_snapshot_reads_as_nothing_recorded(snapshot):
    read = RunSnapshot.read(snapshot)

    assert (read.source, read.file, read.other_model, read.stated_gpu_count) == (None,) * 4
    assert read.deployment == {} and read.engine == {} and read.workload is None


def test_parts_of_another_type_read_as_absent():
    read = RunSnapshot.read(
        {
            "engine": "vllm",
            "deployment": None,
            "kernel_config": ["file"],
            "file": {"stated": {"gpu_count": True}, "other_model": 3},
            "source": 1,
        }
    )

    assert read.engine == {} and read.deployment == {} and read.kernel_config is None
    assert read.stated_gpu_count is None and read.other_model is None and read.source is None
