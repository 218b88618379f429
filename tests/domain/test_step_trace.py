"""domain.step_trace on real traces of vLLM's CPU build and on GPU traces built here, whose class
times are known to the microsecond; bad input of every kind; the CLI's step-breakdown."""

import gzip
import json
import os
import time
import zipfile
from pathlib import Path

import ijson
import pytest

from domain.step_breakdown import CLASSES, StepBreakdown
from domain.step_trace import TraceError, read_breakdown
from tests.fakes import python_module

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "fixtures" / "traces"
TP1 = TRACES / "vllm-cpu-tp1"
TP2 = TRACES / "vllm-cpu-tp2"
TP1_RANK = next(TP1.glob("*rank0*.pt.trace.json.gz"))
TP1_FRONT = next(TP1.glob("*async_llm*"))
TORCH_GPU = TRACES / "torch-gpu" / "rank0.pt.trace.json.gz"
HF_CONFIG = next((ROOT / "tests" / "fixtures" / "hf_configs").glob("*.json"))


def test_ijson_reads_with_its_c_backend():
    # the pure-Python backend is some 17 times slower (docs/decisions.md, 47)
    assert ijson.backend == "yajl2_c"


def _assert_steps_add_up(breakdown: StepBreakdown):
    for rank in breakdown.ranks:
        assert rank.steps
        for step in rank.steps:
            assert sum(step.classes.values()) == pytest.approx(step.wall_us, rel=0.05)
        for kind in rank.kinds:
            assert [c.name for c in kind.classes] == list(CLASSES)
            assert sum(c.share for c in kind.classes) == pytest.approx(1, rel=0.05)


def test_it_breaks_down_a_tp1_cpu_window():
    breakdown = read_breakdown(TP1)
    assert (breakdown.engine, breakdown.engine_version) == ("vllm", "0.32.0")
    assert breakdown.rules == "vllm 0.32 cpu"
    (rank,) = breakdown.ranks
    assert (rank.rank, rank.device) == (0, "cpu")
    assert breakdown.kinds() == ["decode", "mixed"]
    assert rank.kind("decode").steps == 19 and rank.kind("mixed").steps == 1
    mixed = next(s for s in rank.steps if s.kind == "mixed")
    assert (mixed.prefill_tokens, mixed.decode_tokens) == (256, 4)
    assert {(s.prefill_tokens, s.decode_tokens) for s in rank.steps if s.kind == "decode"} == {
        (0, 8)
    }
    for kind in rank.kinds:
        assert kind.time_us("communication") == 0
        assert kind.step_us_p10 <= kind.step_us_median <= kind.step_us_p90
    decode = rank.kind("decode")
    assert [t.name for t in decode.classes[CLASSES.index("gemm")].top] == ["_C::onednn_mm"]
    assert "_C::cpu_fused_moe" in [t.name for t in decode.classes[0].top]
    assert decode.share("sampling") > 0
    # the front end's file has no steps: a note, not an error
    assert any("async_llm" in note and "no engine step" in note for note in breakdown.notes)
    _assert_steps_add_up(breakdown)


def test_it_finds_tp2s_all_reduce_and_the_rank_that_waits():
    breakdown = read_breakdown(TP2)
    assert [r.rank for r in breakdown.ranks] == [0, 1]
    assert breakdown.mean_share("decode", "communication") > 0.10
    rank0 = breakdown.ranks[0].kind("decode")
    assert rank0.share("communication") > 0.2
    assert rank0.classes[CLASSES.index("communication")].top[0].name == "_C::shm_allreduce"
    assert any(n.startswith("rank 0 spends") and "waits" in n for n in breakdown.notes)
    # both ranks' steps on one clock: the second rank starts within the window
    assert min(s.start_ms for r in breakdown.ranks for s in r.steps) == 0
    _assert_steps_add_up(breakdown)


def test_it_reads_a_zip_of_the_window(tmp_path):
    archive = tmp_path / "window.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        for path in TP1.iterdir():
            zipped.write(path, f"prof1/{path.name}")
    breakdown = read_breakdown(archive)
    assert breakdown.ranks[0].file.startswith(f"{archive}:prof1/")
    assert breakdown.ranks[0].kind("decode").steps == 19


def test_it_reads_a_zip_member_whose_name_no_file_system_takes(tmp_path):
    archive = tmp_path / "window.zip"
    long_name = f"{TP1_RANK.name[: -len('.pt.trace.json.gz')]}.{'x' * 300}.pt.trace.json.gz"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.write(TP1_RANK, long_name)

    breakdown = read_breakdown(archive)

    (rank,) = breakdown.ranks
    # the member as the archive names it (the contract keeps a name's last 400 characters)
    assert f"{archive}:{long_name}".endswith(rank.file)
    assert (rank.rank, rank.kind("decode").steps) == (0, 19)


def test_it_keeps_the_first_steps_of_a_long_window(monkeypatch):
    monkeypatch.setattr("domain.step_trace.MAX_STEPS", 5)
    breakdown = read_breakdown(TP1_RANK)
    assert len(breakdown.ranks[0].steps) == 5
    assert breakdown.ranks[0].kind("decode").steps == 19
    assert any("the first 5 are listed" in note for note in breakdown.notes)


def test_it_joins_a_real_kineto_traces_kernels_to_their_steps():
    breakdown = read_breakdown(TORCH_GPU)
    assert breakdown.rules == "vllm 0.32-0.34 gpu"
    (rank,) = breakdown.ranks
    assert rank.device == "gpu"
    decode = rank.kind("decode")
    assert decode.steps == 6
    # each step: the graph's GEMM (cudaGraphLaunch) and the second stream's (cuLaunchKernelEx)
    assert 15 < decode.time_us("gemm") < 25
    assert decode.classes[CLASSES.index("gemm")].top[0].name.startswith("nvjet_sm90")
    # torch's own RMSNorm is no kernel of vLLM's: other, by name, launched in the graph too
    assert [t.name for t in decode.classes[CLASSES.index("other")].top] == [
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, "
        "float, true>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 "
        "const*, float*, float*, c10::BFloat16*)"
    ]
    assert {t.name for t in decode.classes[CLASSES.index("memory")].top} >= {
        "Memcpy HtoD (Pinned -> Device)",
        "Memcpy DtoH (Device -> Pageable)",
    }
    assert decode.time_us("sampling") > 0
    assert all(s.classes["idle"] > 0 for s in rank.steps)
    _assert_steps_add_up(breakdown)


# A GPU trace as Kineto writes it: CPU-side annotations and runtime calls, device kernels joined
# to their launches by correlation id.


def _x(cat, name, ts, dur, **args):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def _kernel(name, ts, dur, corr, stream=7, cat="kernel"):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr, "stream": stream, "device": 0},
    }


def _gpu_trace(
    path, *, rank=3, comm_us=20, version="0.33.0", steps=None, engine_key="vllm_version"
):
    """Step A (decode, 4 requests): rms_norm 10 µs, then one CUDA graph of a GEMM 20, fused MoE
    20 and an all-reduce `comm_us` on a second stream overlapping the MoE's last 10 µs, an idle
    gap of 10, attention 10, 20 idle until step B. Step B (mixed): a copy 5, idle 5, softmax 10."""
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        _x(
            "user_annotation", steps[0] if steps else "execute_context_0(0)_generation_4(4)", 0, 100
        ),
        _x("cpu_op", "aten::mm", 5, 3),
        _x("cuda_runtime", "cudaLaunchKernel", 10, 2, correlation=1),
        _x("cuda_runtime", "cudaGraphLaunch", 20, 5, correlation=2),
        _x("cuda_runtime", "cudaLaunchKernel", 30, 2, correlation=3),
        _x(
            "user_annotation",
            steps[1] if steps else "execute_context_1(128)_generation_3(3)",
            200,
            100,
        ),
        _x("cuda_runtime", "cudaMemcpyAsync", 210, 2, correlation=4),
        _x("cuda_driver", "cuLaunchKernelEx", 220, 2, correlation=5),
        # launched before the window: not a step's, and done before the first step's kernels
        _kernel("fused_moe_kernel", 900, 50, 99),
        _kernel("void vllm::rms_norm_kernel<c10::BFloat16, 8, 4>", 1000, 10, 1),
        _kernel("nvjet_tst_128x64_64x8_1x2_h_bz_coopA_NNT", 1010, 20, 2),
        _kernel("fused_moe_kernel", 1030, 20, 2),
        _kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 1040, comm_us, 2, stream=8),
        _kernel("kernel_unified_attention_2d", 1040 + comm_us + 10, 10, 3),
        _kernel("Memcpy HtoD (Pageable -> Device)", 1080 + comm_us, 5, 4, cat="gpu_memcpy"),
        _kernel("void at::native::cunn_SoftMaxForward<4, float, float>", 1090 + comm_us, 10, 5),
        {
            "ph": "X",
            "cat": "gpu_user_annotation",
            "name": "execute_context_0(0)_generation_4(4)",
            "pid": 0,
            "tid": 7,
            "ts": 1000,
            "dur": 80,
        },
    ]
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 8},
        engine_key: version,
        "traceEvents": events,
        "traceName": str(path),
    }
    with gzip.open(path, "wt") as out:
        json.dump(trace, out)
    return path


def test_it_splits_a_gpu_step_by_kernel_class(tmp_path):
    breakdown = read_breakdown(_gpu_trace(tmp_path / "rank3.pt.trace.json.gz"))
    assert breakdown.rules == "vllm 0.32-0.34 gpu"
    (rank,) = breakdown.ranks
    assert (rank.rank, rank.device) == (3, "gpu")
    decode = rank.kind("decode")
    assert decode.steps == 1
    # wall: from the step's first kernel (1000) to the next step's (1100)
    assert decode.step_us_median == pytest.approx(100)
    expected = {
        "norm": 10,
        "gemm": 20,
        "moe": 10 + 5,  # alone 10 µs, then half of the 10 µs beside the all-reduce
        "communication": 5 + 10,
        "attention": 10,
        "idle": 10 + 20,
        "sampling": 0,
        "memory": 0,
        "other": 0,
    }
    assert {c.name: c.time_us for c in decode.classes} == pytest.approx(expected)
    assert decode.share("idle") == pytest.approx(0.30)
    assert decode.classes[0].top[0].name == "fused_moe_kernel"
    mixed = rank.kind("mixed")
    # the last step runs to its last kernel's end
    assert mixed.step_us_median == pytest.approx(20)
    assert mixed.time_us("memory") == pytest.approx(5)
    assert mixed.time_us("sampling") == pytest.approx(10)
    assert mixed.time_us("idle") == pytest.approx(5)
    assert [(s.prefill_tokens, s.decode_tokens) for s in rank.steps] == [(0, 4), (128, 3)]
    _assert_steps_add_up(breakdown)


def test_it_tells_which_rank_differs(tmp_path):
    for rank in range(4):
        _gpu_trace(
            tmp_path / f"rank{rank}.pt.trace.json.gz", rank=rank, comm_us=60 if rank == 2 else 20
        )
    breakdown = read_breakdown(tmp_path)
    assert [r.rank for r in breakdown.ranks] == [0, 1, 2, 3]
    spread = [n for n in breakdown.notes if n.startswith("rank 2")]
    assert any("median decode step" in n for n in spread)
    assert any("in communication, the others" in n and "waits on them" in n for n in spread)
    assert not any(n.startswith(("rank 0", "rank 1", "rank 3")) for n in breakdown.notes)


def test_it_reads_sglangs_step_spans(tmp_path):
    path = _gpu_trace(
        tmp_path / "1700000000-TP-1.trace.json.gz",
        rank=1,
        steps=("step[DECODE bs=4]", "step[EXTEND bs=2 toks=128]"),
        engine_key="sglang_unused",
    )
    breakdown = read_breakdown(path)
    assert (breakdown.engine, breakdown.rules) == ("sglang", "sglang 0.5.23 gpu")
    assert [s.kind for s in breakdown.ranks[0].steps] == ["decode", "prefill"]
    assert breakdown.ranks[0].kind("decode").time_us("moe") == pytest.approx(15)


def test_it_reads_vllms_detailed_step_names(tmp_path):
    steps = (
        "execute_4_context_0(sq0sk0sqsq0sqsk0)_generation_4(sq4sk900sqsq4sqsk900)",
        "execute_131_context_1(sq128sk128sqsq16384sqsk16384)_generation_3(sq3sk700sqsq3sqsk700)",
    )
    breakdown = read_breakdown(_gpu_trace(tmp_path / "rank0.pt.trace.json.gz", steps=steps))
    points = breakdown.ranks[0].steps
    assert [(s.kind, s.prefill_tokens, s.decode_tokens) for s in points] == [
        ("decode", 0, 4),
        ("mixed", 128, 3),
    ]


def test_it_refuses_an_engine_version_without_a_table(tmp_path):
    path = _gpu_trace(tmp_path / "rank0.pt.trace.json.gz", version="0.29.1")
    with pytest.raises(TraceError, match=r"rank0\.pt\.trace\.json\.gz: vllm 0\.29\.1 on gpu"):
        read_breakdown(path)


def test_it_refuses_a_trace_of_no_engine(tmp_path):
    path = _gpu_trace(tmp_path / "train.json.gz", steps=("ProfilerStep#3", "ProfilerStep#4"))
    with pytest.raises(TraceError, match="train.json.gz: no engine step annotations"):
        read_breakdown(path)


# Bad input: one TraceError each, naming the file.


def test_it_refuses_a_truncated_gzip(tmp_path):
    cut = tmp_path / "rank0.pt.trace.json.gz"
    cut.write_bytes(TP1_RANK.read_bytes()[:100_000])
    with pytest.raises(TraceError, match=f"{cut}: a truncated or damaged gzip file"):
        read_breakdown(cut)


def test_it_refuses_truncated_json(tmp_path):
    cut = tmp_path / "rank0.pt.trace.json"
    text = gzip.decompress(TP1_RANK.read_bytes())
    cut.write_bytes(text[: len(text) // 2])
    with pytest.raises(TraceError, match=f"{cut}: the JSON ends early"):
        read_breakdown(cut)


def test_it_refuses_json_that_is_not_a_trace():
    with pytest.raises(TraceError, match=f"{HF_CONFIG}: not a torch-profiler trace") as caught:
        read_breakdown(HF_CONFIG)
    assert "{" not in str(caught.value)


def test_it_refuses_an_empty_folder(tmp_path):
    with pytest.raises(TraceError, match=f"{tmp_path}: no trace files"):
        read_breakdown(tmp_path)


def test_it_refuses_the_front_end_file_alone():
    with pytest.raises(TraceError, match=f"{TP1_FRONT}: no engine step annotations"):
        read_breakdown(TP1_FRONT)


def test_it_refuses_a_file_over_the_limit_without_reading_it(tmp_path):
    big = tmp_path / "rank0.pt.trace.json"
    with open(big, "wb") as out:
        out.truncate(2 * 2**30)  # sparse: 2 GiB that take no disk
    started = time.monotonic()
    with pytest.raises(TraceError, match=f"{big}: 2.0 GiB, over the 1.0 GiB limit"):
        read_breakdown(big, max_bytes=2**30)
    assert time.monotonic() - started < 1


def test_it_stops_reading_past_the_limit_uncompressed():
    # 0.25 MiB on disk, some 3 MiB inflated
    with pytest.raises(TraceError, match=f"{TP1_RANK}: over the 0.5 MiB limit uncompressed"):
        read_breakdown(TP1_RANK, max_bytes=2**19)


def test_it_refuses_a_zip_member_outside_the_archive(tmp_path):
    archive = tmp_path / "window.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("../../etc/rank0.pt.trace.json", "{}")
    with pytest.raises(TraceError, match=f'{archive}: member "../../etc/rank0.pt.trace.json"'):
        read_breakdown(archive)


def test_it_refuses_a_zip_bomb(tmp_path):
    archive = tmp_path / "window.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        zipped.writestr("rank0.pt.trace.json", b" " * 20_000_000)
    with pytest.raises(TraceError, match=f"{archive}:rank0.pt.trace.json: inflates .* zip bomb"):
        read_breakdown(archive)


def test_it_refuses_two_files_of_one_rank(tmp_path):
    _gpu_trace(tmp_path / "a.pt.trace.json.gz", rank=0)
    _gpu_trace(tmp_path / "b.pt.trace.json.gz", rank=0)
    with pytest.raises(TraceError, match="rank 0 appears in two files"):
        read_breakdown(tmp_path)


# The CLI


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("MOEOPS_TOKEN", "MOEOPS_URL")}
    return python_module("workers.cli", "step-breakdown", *args, env=env, timeout=120)


def test_the_cli_prints_the_breakdown_as_json_without_a_token():
    done = _cli(str(TP1), "--json")
    assert done.returncode == 0, done.stderr
    breakdown = StepBreakdown.model_validate_json(done.stdout)
    assert breakdown.ranks[0].kind("decode").steps == 19


def test_the_cli_prints_a_table_per_rank_and_kind():
    done = _cli(str(TP2))
    assert done.returncode == 0, done.stderr
    assert "rank 1 (cpu)" in done.stdout and "decode: 19 steps" in done.stdout
    assert "communication" in done.stdout and "p90" in done.stdout


def test_the_cli_refuses_bad_input_in_one_line(tmp_path):
    done = _cli(str(tmp_path))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and str(tmp_path) in done.stderr
    assert "Traceback" not in done.stderr
