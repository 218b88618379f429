"""The step breakdown of a real GPU trace (gpu tests): a decode-like step on one GPU, made of vLLM
0.34's own fused-MoE kernel (from its wheel, tests.engine), attention (PyTorch's flash
scaled_dot_product_attention), an RMSNorm kernel named as vLLM's, an all-reduce (NCCL on one
rank: an AVG, which launches a kernel where an in-place SUM launches none) and a deliberate host
pause, traced by the torch profiler eagerly and as CUDA graphs. Each class's share of the step
must be within 5 points of what CUDA events time for the same parts."""

import gzip
import os
import shutil
import socket
import statistics
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from domain.step_trace import read_breakdown
from tests.engine import engine_source
from tuning.backends import load_backend
from tuning.search import KernelShape

pytestmark = pytest.mark.gpu

TOKENS = 256
# the norm and the all-reduce over many rows, so that each is a share of the step that CUDA
# events can time to a point (one decode batch's 256 rows take 2 µs, under a graph launch's cost)
WIDE_ROWS = 16_384
SHAPE = KernelShape(E=64, N=1024, H=4096, top_k=8)
CONFIG = {
    "BLOCK_SIZE_M": 64,
    "BLOCK_SIZE_N": 128,
    "BLOCK_SIZE_K": 64,
    "GROUP_SIZE_M": 8,
    "num_warps": 4,
    "num_stages": 3,
}
# attention of a decode step: one query per sequence over 2,048 cached tokens, 32 heads of 128
SEQS, HEADS, CONTEXT, HEAD_DIM = 64, 32, 2048, 128
PAUSE_S = 0.0005
STEPS = 30
STEP_NAME = f"execute_context_0(0)_generation_{TOKENS}({TOKENS})"
TOLERANCE = 0.05


def rms_norm_kernel():
    """An RMSNorm kernel named as vLLM's. Triton (and tuning.timing, which imports it) is
    imported in the functions, not with the module: without a GPU, the kernel tests collected
    beside this one need their interpreter set before Triton's first import
    (tests/interpreted.py)."""
    import triton
    import triton.language as tl

    @triton.jit
    def rms_norm_kernel(x_ptr, w_ptr, out_ptr, H, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < H
        x = tl.load(x_ptr + row * H + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        scale = tl.rsqrt(tl.sum(x * x, 0) / H + eps)
        tl.store(out_ptr + row * H + offs, (x * scale * w).to(out_ptr.dtype.element_ty), mask=mask)

    return rms_norm_kernel


def join_one_rank():
    """This process as the one rank of an NCCL group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=1,
        device_id=torch.device("cuda", 0),
    )


@pytest.fixture(scope="module")
def parts():
    join_one_rank()
    yield build_parts()
    dist.destroy_process_group()


def build_parts():
    """The step's parts by class: each a callable that launches that part's kernels."""
    import triton.language as tl

    from tuning.timing import make_weights, random_routing

    norm_kernel = rms_norm_kernel()
    backend = load_backend("vllm", source_dir=engine_source("vllm", "0.34.0"))
    torch.manual_seed(0)
    x = torch.randn((TOKENS, SHAPE.H), device="cuda", dtype=torch.bfloat16)
    norm_w = torch.randn(SHAPE.H, device="cuda", dtype=torch.bfloat16)
    wide = torch.randn((WIDE_ROWS, SHAPE.H), device="cuda", dtype=torch.bfloat16)
    wide_normed = torch.empty_like(wide)
    weights = make_weights(SHAPE, seed=1)
    topk_weights, topk_ids = (t[0] for t in random_routing(1, TOKENS, SHAPE.E, SHAPE.top_k))
    # the experts' two GEMMs in vLLM's own kernel and launcher; the tokens' assignment to the
    # experts, made once here, is not part of the step (vLLM's align is a CUDA op of its own)
    backend._platform()
    vllm = backend.source
    sorted_ids, expert_ids, num_padded = vllm._prepare_expert_assignment(
        topk_ids, CONFIG, TOKENS, SHAPE.top_k, SHAPE.E, None, block_shape=None,
        ignore_invalid_experts=True,
    )  # fmt: skip
    up = torch.empty((TOKENS, SHAPE.top_k, 2 * SHAPE.N), device="cuda", dtype=torch.bfloat16)
    activated = torch.randn((TOKENS * SHAPE.top_k, SHAPE.N), device="cuda", dtype=torch.bfloat16)
    down = torch.empty((TOKENS, SHAPE.top_k, SHAPE.H), device="cuda", dtype=torch.bfloat16)
    flags = {
        "compute_type": tl.bfloat16,
        "use_fp8_w8a8": False,
        "use_int8_w8a8": False,
        "use_int8_w8a16": False,
        "use_int4_w4a16": False,
        "per_channel_quant": False,
        "block_shape": None,
        "B_bias": None,
    }
    assignment = (topk_weights, sorted_ids, expert_ids, num_padded)
    q = torch.randn((SEQS, HEADS, 1, HEAD_DIM), device="cuda", dtype=torch.bfloat16)
    k = torch.randn((SEQS, HEADS, CONTEXT, HEAD_DIM), device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    reduced = torch.randn((WIDE_ROWS, SHAPE.H), device="cuda", dtype=torch.bfloat16)

    def norm():
        norm_kernel[(WIDE_ROWS,)](wide, norm_w, wide_normed, SHAPE.H, 1e-6, BLOCK=SHAPE.H)

    def attention():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, k, v)

    def moe():
        vllm.invoke_fused_moe_triton_kernel(
            x, weights.w1, up, None, None, *assignment, False, SHAPE.top_k, CONFIG, **flags
        )
        vllm.invoke_fused_moe_triton_kernel(
            activated, weights.w2, down, None, None, *assignment, True, 1, CONFIG, **flags
        )

    def communication():
        dist.all_reduce(reduced, op=dist.ReduceOp.AVG)

    parts = {"norm": norm, "attention": attention, "moe": moe, "communication": communication}
    for part in parts.values():
        part()
    torch.cuda.synchronize()
    return parts


def as_graphs(parts):
    """Each part captured as a CUDA graph, warmed up on a side stream first."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for launch in parts.values():
            launch()
    torch.cuda.current_stream().wait_stream(stream)
    graphs = {}
    for name, launch in parts.items():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch()
        graphs[name] = graph
    torch.cuda.synchronize()
    return graphs


def run_steps(first_half, second_half):
    """Run STEPS steps, each annotated as vLLM annotates a decode step of TOKENS requests: the
    first half's kernels, the host waiting PAUSE_S on a drained GPU, the second half's. Returns
    the median step time between the events recorded at each step's start (ms)."""
    marks = []
    for _ in range(STEPS + 1):
        mark = torch.cuda.Event(enable_timing=True)
        mark.record()
        marks.append(mark)
        with torch.profiler.record_function(STEP_NAME):
            first_half()
            torch.cuda.synchronize()
            time.sleep(PAUSE_S)
            second_half()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(marks[1:-1], marks[2:], strict=True))


def _trace(tmp_path, first_half, second_half):
    run_steps(first_half, second_half)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        # vLLM's profiler wrapper names its version in the trace; this step runs 0.34's kernel
        prof.add_metadata_json("vllm_version", '"0.34.0"')
        wall_ms = run_steps(first_half, second_half)
    path = tmp_path / "rank0.pt.trace.json"
    prof.export_chrome_trace(str(path))
    kept = os.environ.get("MOEOPS_KEEP_TRACES")
    if kept:
        # a real GPU window for the pages and fixtures (gzip: 1/10 the size)
        with (
            open(path, "rb") as raw,
            gzip.open(Path(kept) / f"{tmp_path.name}.json.gz", "wb") as gz,
        ):
            shutil.copyfileobj(raw, gz)
    return path, wall_ms


def _expected(parts, wall_ms, reps=20):
    """Each class's share of the step as CUDA events time its part's kernels, idle the rest of
    the step. The parts replay as CUDA graphs one after the other, an event between each two:
    the host queues each replay before the one ahead of it ends, so an event pair holds one
    part's kernels and no host time, in the order (and warmth) of the step."""
    graphs = as_graphs(parts)
    times = {name: [] for name in graphs}
    for _ in range(reps):
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(len(graphs) + 1)]
        marks[0].record()
        for mark, graph in zip(marks[1:], graphs.values(), strict=True):
            graph.replay()
            mark.record()
        marks[-1].synchronize()
        for name, a, b in zip(graphs, marks, marks[1:], strict=False):
            times[name].append(a.elapsed_time(b))
    shares = {name: statistics.median(t) / wall_ms for name, t in times.items()}
    shares["idle"] = 1 - sum(shares.values())
    return shares


def _check(breakdown, expected):
    (rank,) = breakdown.ranks
    assert rank.device == "gpu"
    decode = rank.kind("decode")
    assert decode.steps >= STEPS - 2
    seen = {c.name: c.share for c in decode.classes}
    print({k: (round(seen.get(k, 0), 3), round(v, 3)) for k, v in expected.items()})
    print({c.name: [t.name[:60] for t in c.top] for c in decode.classes if c.top})
    for name, share in expected.items():
        assert seen.get(name, 0) == pytest.approx(share, abs=TOLERANCE), (name, seen, expected)
    assert sum(seen.values()) == pytest.approx(1, abs=TOLERANCE)
    communication = next(c for c in decode.classes if c.name == "communication")
    # which kernel the one-rank all-reduce launched (NCCL's oneRankReduce, named without "nccl")
    print("all-reduce kernels:", [t.name for t in communication.top])
    assert communication.top


def halves(launches):
    """(first, second): the step's halves around the host's pause, from launches by part (the
    parts' callables, or their graphs' replays): norm and attention, then the MoE and the
    all-reduce."""

    def first():
        launches["norm"]()
        launches["attention"]()

    def second():
        launches["moe"]()
        launches["communication"]()

    return first, second


def test_an_eager_decode_step_breaks_down_as_cuda_events_time_its_parts(parts, tmp_path):
    path, wall_ms = _trace(tmp_path, *halves(parts))

    _check(read_breakdown(path), _expected(parts, wall_ms))


def test_a_decode_step_of_cuda_graphs_breaks_down_as_cuda_events_time_its_parts(parts, tmp_path):
    replays = {name: graph.replay for name, graph in as_graphs(parts).items()}

    path, wall_ms = _trace(tmp_path, *halves(replays))

    _check(read_breakdown(path), _expected(parts, wall_ms))
