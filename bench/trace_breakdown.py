"""domain.step_trace.read_breakdown on a window as large as a real GPU deployment writes: wall
time and peak resident memory (targets: 60 s and 1 GiB on the 2-core machine).

    .venv/bin/python bench/trace_breakdown.py [--ranks 8] [--steps 40] [--layers 60] [--keep DIR]
        [--workers 2] [--json-load]

Writes one gzipped Kineto-style trace per rank into a temp folder (over 1 GB uncompressed in
all at the defaults), shaped like vLLM's eager GPU traces with record_shapes: per step the
engine's annotation; per layer 16 kernels (RMSNorm, QKV GEMM, rotary, KV-cache write,
attention, output GEMM, NCCL all-reduce on its own stream, fused add-RMSNorm, router GEMM,
top-k softmax, MoE align, two fused-MoE launches, SiLU-and-mul, MoE sum, all-reduce), each a
cudaLaunchKernel with its correlation id and eight cpu_op events around it (the custom op, its
allocations and views). Then reads them in a fresh process and prints the figures as JSON.
"""

# ruff: noqa: E501 -- kernel names as Kineto spells them

import argparse
import gzip
import json
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (kernel name, class it should land in, µs on the GPU, stream)
LAYER = (
    (
        "void vllm::rms_norm_kernel<c10::BFloat16, 8, 4>(c10::BFloat16*, long, c10::BFloat16 const*, c10::BFloat16 const*, float, int, int)",
        "norm",
        4,
        7,
    ),
    ("nvjet_tst_128x64_64x8_1x2_h_bz_coopA_NNT", "gemm", 12, 7),
    (
        "void vllm::rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloat16*, c10::BFloat16 const*, int, long, long, long, int, int, int)",
        "attention",
        3,
        7,
    ),
    (
        "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16*, __nv_bfloat16*, long const*, long, long, long, long, int, int, int, float const*, float const*)",
        "attention",
        3,
        7,
    ),
    (
        "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>(flash::Flash_fwd_params)",
        "attention",
        18,
        7,
    ),
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
        "gemm",
        9,
        7,
    ),
    (
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "communication",
        14,
        20,
    ),
    (
        "void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, c10::BFloat16*, c10::BFloat16 const*, float, int, int)",
        "norm",
        4,
        7,
    ),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "gemm", 3, 7),
    (
        "void vllm::moe::topkGatingSoftmax<8, 128, 4, 16, 32, int, float>(float const*, bool const*, float*, int, int*, int, int, int, bool)",
        "moe",
        3,
        7,
    ),
    (
        "void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, int, int, unsigned long, int*, int, bool)",
        "moe",
        4,
        7,
    ),
    ("fused_moe_kernel", "moe", 30, 7),
    (
        "void vllm::act_and_mul_kernel<c10::BFloat16, &(c10::BFloat16 vllm::silu_kernel<c10::BFloat16>(c10::BFloat16 const&)), true>(c10::BFloat16*, c10::BFloat16 const*, int)",
        "norm",
        3,
        7,
    ),
    ("fused_moe_kernel", "moe", 22, 7),
    (
        "void vllm::moe::moe_sum_kernel<c10::BFloat16, 8>(c10::BFloat16*, c10::BFloat16 const*, int)",
        "moe",
        3,
        7,
    ),
    (
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "communication",
        14,
        20,
    ),
)
OPS = (
    "vllm::custom_op",
    "aten::empty",
    "aten::empty_strided",
    "aten::view",
    "aten::reshape",
    "aten::as_strided",
    "aten::t",
    "aten::expand",
)
# the host launches a kernel every LAUNCH_US; the GPU runs behind it
LAUNCH_US = 9.0
STEP_GAP_US = 600.0

KERNEL = (
    '{"ph":"X","cat":"kernel","name":%s,"pid":0,"tid":%d,"ts":%.3f,"dur":%.3f,"args":{'
    '"External id":%d,"queued":0,"device":0,"context":1,"stream":%d,"correlation":%d,'
    '"registers per thread":128,"shared memory":49152,"blocks per SM":1.25,"warps per SM":5.0,'
    '"grid":[132,1,1],"block":[128,1,1],"est. achieved occupancy %%":8}}'
)
LAUNCH = (
    '{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":4242,"tid":4242,"ts":%.3f,'
    '"dur":3.1,"args":{"External id":%d,"cbid":211,"correlation":%d}}'
)
OP = (
    '{"ph":"X","cat":"cpu_op","name":"%s","pid":4242,"tid":4242,"ts":%.3f,"dur":%.3f,"args":{'
    '"External id":%d,"Record function id":0,"Ev Idx":%d,"Input Dims":[[8, 7168], [7168], [], '
    '[8, 7168]],"Input type":["c10::BFloat16", "c10::BFloat16", "Scalar", "c10::BFloat16"],'
    '"Input Strides":[[7168, 1], [1], [], [7168, 1]],"Concrete Inputs":["", "", "1e-06", ""]}}'
)
STEP = (
    '{"ph":"X","cat":"user_annotation","name":"execute_context_0(0)_generation_%d(%d)",'
    '"pid":4242,"tid":4242,"ts":%.3f,"dur":%.3f,"args":{"External id":%d,"Record function id":0}}'
)


def write_rank(folder: str, rank: int, steps: int, layers: int, batch: int) -> int:
    """One rank's trace; returns its uncompressed size (bytes)."""
    path = Path(folder) / f"dp0_pp0_tp{rank}_dcp0_ep{rank}_rank{rank}.{rank}.pt.trace.json.gz"
    header = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85e9}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 8},
        "vllm_version": "0.33.0",
    }
    names = [json.dumps(name) for name, *_ in LAYER]
    size = 0
    corr = 1
    cpu = 1_000_000.0 + rank * 3.0
    gpu = cpu + 40.0
    with gzip.open(path, "wt", compresslevel=1) as out:

        def emit(text):
            nonlocal size
            out.write(text)
            size += len(text)

        emit(json.dumps(header)[:-1] + ', "traceEvents": [\n')
        emit('{"ph":"M","name":"process_name","pid":4242,"tid":0,"args":{"name":"python"}}')
        for _ in range(steps):
            step_start = cpu
            chunk = []
            for _ in range(layers):
                for (_, _, dur, stream), name in zip(LAYER, names, strict=True):
                    for k, op in enumerate(OPS):
                        chunk.append(OP % (op, cpu + k * 0.5, 0.4, corr, corr))
                    chunk.append(LAUNCH % (cpu + 3.5, corr, corr))
                    gpu = max(gpu, cpu + 20.0)
                    chunk.append(KERNEL % (name, stream, gpu, dur, corr, stream, corr))
                    gpu += dur + 1.0
                    corr += 1
                    cpu += LAUNCH_US
            # the sampler's launches come after the annotated forward
            chunk.append(STEP % (batch, batch, step_start, cpu - step_start + 5, corr))
            emit(",\n" + ",\n".join(chunk))
            cpu = max(cpu, gpu) + STEP_GAP_US
        emit('\n], "traceName": "bench"}\n')
    return size


def json_load(folder: str) -> dict:
    """The road not taken: rank 0's trace through json.load, for its time and memory."""
    path = sorted(Path(folder).glob("*rank0.*"))[0]
    started = time.perf_counter()
    with gzip.open(path, "rt") as source:
        events = len(json.load(source)["traceEvents"])
    return {
        "json_load_rank0_s": round(time.perf_counter() - started, 1),
        "json_load_rank0_peak_rss_mib": round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        ),
        "json_load_rank0_events": events,
    }


def read(folder: str, workers: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from domain.step_trace import read_breakdown

    started = time.perf_counter()
    breakdown = read_breakdown(Path(folder), workers=workers)
    wall = time.perf_counter() - started
    self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    decode = breakdown.ranks[0].kind("decode")
    return {
        "workers": workers,
        "wall_s": round(wall, 1),
        "peak_rss_parent_mib": round(self_kib / 1024),
        "peak_rss_largest_child_mib": round(child_kib / 1024),
        "ranks": len(breakdown.ranks),
        "decode_steps_rank0": decode.steps,
        "decode_step_ms_rank0": round(decode.step_us_median / 1000, 2),
        "shares_rank0": {c.name: round(c.share, 3) for c in decode.classes},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--layers", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--keep", help="write the traces here and keep them")
    parser.add_argument("--workers", type=int, default=2, help="rank files read at once")
    parser.add_argument(
        "--json-load", action="store_true", help="also time rank 0's file through json.load"
    )
    parser.add_argument("--read", help=argparse.SUPPRESS)
    parser.add_argument("--read-json-load", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read:
        print(json.dumps(read(args.read, args.workers)))
        return 0
    if args.read_json_load:
        print(json.dumps(json_load(args.read_json_load)))
        return 0
    with tempfile.TemporaryDirectory(prefix="moeops-bench-trace-") as scratch:
        folder = args.keep or scratch
        Path(folder).mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with ProcessPoolExecutor(2) as pool:
            sizes = list(
                pool.map(
                    write_rank,
                    [folder] * args.ranks,
                    range(args.ranks),
                    [args.steps] * args.ranks,
                    [args.layers] * args.ranks,
                    [args.batch] * args.ranks,
                )
            )
        written = time.perf_counter() - started
        on_disk = sum(p.stat().st_size for p in Path(folder).iterdir())
        # a fresh process: its peak RSS is the reader's alone
        argv = [sys.executable, __file__, "--read", folder, "--workers", str(args.workers)]
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        figures = json.loads(done.stdout)
        if args.json_load:
            argv = [sys.executable, __file__, "--read-json-load", folder]
            done = subprocess.run(argv, capture_output=True, text=True, check=True)
            figures.update(json.loads(done.stdout))
    figures = {
        "uncompressed_gb": round(sum(sizes) / 1e9, 2),
        "gzipped_mb": round(on_disk / 1e6),
        "write_s": round(written, 1),
        **figures,
    }
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
