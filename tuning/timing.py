"""Timing one MoE layer on the GPU in CUDA graphs, and the hardware floor it is compared with.

A candidate is timed as the whole layer (sort-and-pad, both GEMMs, activation, top-k sum):
several layer calls captured in one CUDA graph, each call on its own inputs, fresh router
choices copied in before every replay, the median over the replays divided by the calls.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from tuning.cache_dir import cache_dir
from tuning.moe_ops import FP8_DTYPE
from tuning.reference import quantize_fp8_blocks, quantize_fp8_per_expert
from tuning.search import KernelShape

# A GPU's measured ceilings are reused this long (a week: they move with the driver, clocks and
# power limits, which the key does not all hold).
CEILINGS_MAX_AGE_S = 7 * 24 * 3600


@dataclass(frozen=True)
class DeviceCeilings:
    """What the GPU sustains: copy bandwidth (TB/s, bytes read + written) and matrix rates."""

    bandwidth_tbps: float
    bf16_tflops: float
    fp8_tflops: float | None

    def matrix_tflops(self, dtype: str) -> float:
        """TFLOP/s for the GEMMs of a layer in dtype (bf16's rate where fp8 was not measured)."""
        if dtype == "fp8_w8a8" and self.fp8_tflops:
            return self.fp8_tflops
        return self.bf16_tflops


@dataclass
class MoEWeights:
    """Random expert weights of one shape on the GPU, quantised as the shape's dtype says."""

    w1: torch.Tensor
    w2: torch.Tensor
    w1_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None

    def layer_kwargs(self, shape: KernelShape) -> dict:
        """The keyword arguments fused_moe needs besides config and out."""
        return {
            "dtype": shape.dtype,
            "block_shape": list(shape.block_shape) if shape.block_shape else None,
            "w1_scale": self.w1_scale,
            "w2_scale": self.w2_scale,
        }


def make_weights(shape: KernelShape, device: torch.device | str = "cuda", seed: int = 0):
    """w1 [E, 2N, H], w2 [E, H, N] ~ N(0, 1/fan_in), in bf16 or fp8 with their scales."""
    generator = torch.Generator(device=device).manual_seed(seed)
    weights = []
    for rows, cols in ((2 * shape.N, shape.H), (shape.H, shape.N)):
        w = torch.randn(
            (shape.E, rows, cols), generator=generator, device=device, dtype=torch.bfloat16
        )
        weights.append(w.mul_(cols**-0.5))
    if shape.dtype != "fp8_w8a8":
        dtype = activation_dtype(shape)
        return MoEWeights(weights[0].to(dtype), weights[1].to(dtype))
    quantized = []
    for w in weights:
        # one expert at a time keeps the float32 temporaries small
        parts = [
            quantize_fp8_blocks(w[e : e + 1], list(shape.block_shape))
            if shape.block_shape
            else quantize_fp8_per_expert(w[e : e + 1])
            for e in range(shape.E)
        ]
        quantized.append((torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])))
    (w1, s1), (w2, s2) = quantized
    return MoEWeights(w1, w2, s1, s2)


def unset_weights(shape: KernelShape, device: torch.device | str = "cpu") -> MoEWeights:
    """Weights and scales of make_weights's shapes, dtypes and strides, values left unset: what
    compiling the layer's kernels needs, at no cost (one expert's are made to learn them)."""
    one = make_weights(replace(shape, E=1), device=device)

    def unset(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        return torch.empty((shape.E, *t.shape[1:]), dtype=t.dtype, device=device)

    return MoEWeights(unset(one.w1), unset(one.w2), unset(one.w1_scale), unset(one.w2_scale))


def activation_dtype(shape: KernelShape) -> torch.dtype:
    """dtype of x and out: the GEMM dtype, except bf16 around fp8 GEMMs."""
    return {"fp16": torch.float16, "fp32": torch.float32}.get(shape.dtype, torch.bfloat16)


def random_routing(
    sets: int, M: int, E: int, top_k: int, *, device="cuda", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sets` independent router outputs: weights [sets, M, top_k] float32, ids int32.

    Softmax over E random logits, top-k; every token picks top_k distinct experts.
    """
    generator = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn((sets, M, E), generator=generator, device=device)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    return weights.contiguous(), ids.to(torch.int32).contiguous()


def routed(
    routing, sets: int, M: int, E: int, top_k: int, *, device="cuda", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """random_routing's weights and ids, the ids drawn under routing (tuning.routing.Routing;
    None or uniform: random_routing's own). The weights are random_routing's, whatever the
    routing: they scale rows, and no kernel's speed depends on them."""
    weights, ids = random_routing(sets, M, E, top_k, device=device, seed=seed)
    if routing is None or routing.kind == "uniform":
        return weights, ids
    from tuning.routing import draw_ids

    drawn = draw_ids(routing, sets, M, E, top_k, seed=seed)
    return weights, torch.from_numpy(drawn).to(device).contiguous()


class LayerTimer:
    """Times MoE layer implementations at one shape and batch size M on the current GPU.

    calls_per_graph layer calls per CUDA graph, each on its own x [M, H] bf16 and router choices;
    before every replay the choices are refreshed from a pool of routing_sets random routings,
    drawn under routing (tuning.routing.Routing; default uniform).
    backend: whose fused-MoE layer time_config runs (tuning.backends; default moeops' builtin).
    """

    def __init__(
        self,
        shape: KernelShape,
        weights: MoEWeights,
        M: int,
        *,
        backend=None,
        calls_per_graph: int = 4,
        routing_sets: int = 32,
        seed: int = 0,
        routing=None,
    ):
        from tuning.backends.builtin import BuiltinBackend

        self.shape = shape
        self.weights = weights
        self.M = M
        self.backend = backend or BuiltinBackend()
        self.calls = calls_per_graph
        generator = torch.Generator(device="cuda").manual_seed(seed)
        self.x = [
            torch.randn(
                (M, shape.H), generator=generator, device="cuda", dtype=activation_dtype(shape)
            )
            for _ in range(self.calls)
        ]
        self.out = [torch.empty_like(x) for x in self.x]
        self.pool_weights, self.pool_ids = routed(
            routing, max(routing_sets, self.calls), M, shape.E, shape.top_k, seed=seed + 1
        )
        self.topk_weights = [torch.empty_like(self.pool_weights[0]) for _ in range(self.calls)]
        self.topk_ids = [torch.empty_like(self.pool_ids[0]) for _ in range(self.calls)]
        self._refresh(0)
        # Every graph here captures into one memory pool, so each capture reuses the memory the
        # last (destroyed) one used; a pool dies with its last graph, so a small anchor graph
        # keeps it alive. (A private pool per graph is only released on an out-of-memory retry.)
        self._pool = torch.cuda.graph_pool_handle()
        anchor = torch.zeros(1, device="cuda")
        self._anchor = self._capture(lambda j: anchor.add_(1), 1)

    def time_config(
        self,
        config: dict,
        replays: int,
        calls: int | None = None,
        *,
        down_config: dict | None = None,
    ) -> float:
        """Median µs per layer call of the backend's layer with config (and GEMM 2's
        down_config, config's when None); raises if it cannot run."""

        def layer(j: int) -> None:
            self.backend.layer(
                self.x[j],
                self.weights,
                self.topk_weights[j],
                self.topk_ids[j],
                shape=self.shape,
                config=config,
                down_config=down_config,
                out=self.out[j],
            )

        return self.time_layer(layer, replays, calls)

    def time_grouped_mm(self, replays: int, calls: int | None = None) -> float:
        """Median µs per call of the torch._grouped_mm pipeline (bf16 only)."""
        from tuning.reference import grouped_mm_moe

        w1, w2 = self.weights.w1, self.weights.w2

        def layer(j: int) -> None:
            self.out[j].copy_(
                grouped_mm_moe(self.x[j], w1, w2, self.topk_weights[j], self.topk_ids[j])
            )

        return self.time_layer(layer, replays, calls)

    def time_layer(
        self, layer: Callable[[int], None], replays: int, calls: int | None = None
    ) -> float:
        """Median µs per call of layer(j), j the call slot, over `replays` graph replays.

        calls (at most calls_per_graph, all by default) layer calls are captured in the graph.
        """
        calls = min(calls or self.calls, self.calls)
        self._refresh(0)
        # one eager call compiles and loads the kernels and raises launch errors before capture
        layer(0)
        torch.cuda.synchronize()
        graph = self._capture(layer, calls)
        graph.replay()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        for i in range(replays):
            self._refresh(i + 1)
            starts[i].record()
            graph.replay()
            ends[i].record()
        torch.cuda.synchronize()
        elapsed_ms = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
        del graph
        return float(np.median(elapsed_ms)) * 1000.0 / calls

    def _capture(self, layer: Callable[[int], None], calls: int):
        """A CUDA graph of layer(0) … layer(calls − 1), captured into this timer's pool."""
        graph = torch.cuda.CUDAGraph()
        capture_stream = torch.cuda.Stream()
        capture_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(capture_stream):
            # capture_begin/end rather than torch.cuda.graph(), which empties the allocator cache
            graph.capture_begin(pool=self._pool)
            try:
                for j in range(calls):
                    layer(j)
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(capture_stream)
        return graph

    def _refresh(self, replay: int) -> None:
        sets = self.pool_ids.shape[0]
        for j in range(self.calls):
            source = (replay * self.calls + j) % sets
            self.topk_ids[j].copy_(self.pool_ids[source])
            self.topk_weights[j].copy_(self.pool_weights[source])


def measure_ceilings(copy_bytes: int = 2 << 30, matrix_size: int = 8192) -> DeviceCeilings:
    """Copy bandwidth (TB/s) over a copy_bytes device-to-device copy, and the bf16 and fp8
    matrix rates (TFLOP/s) of a matrix_size³ product on random data; medians of 10 after warm-up.
    fp8_tflops is None where torch._scaled_mm does not run."""
    copy_ms = _copy_ms(copy_bytes)
    a = torch.randn((matrix_size, matrix_size), device="cuda", dtype=torch.bfloat16)
    b = torch.randn((matrix_size, matrix_size), device="cuda", dtype=torch.bfloat16)
    flops = 2 * matrix_size**3
    bf16_ms = _median_ms(lambda: a @ b)
    fp8_tflops = None
    try:
        a8, b8 = a.to(FP8_DTYPE), b.to(FP8_DTYPE).t()
        one = torch.ones((), device="cuda")
        fp8_ms = _median_ms(
            lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        )
        fp8_tflops = flops / fp8_ms / 1e9
    except (RuntimeError, TypeError):
        fp8_tflops = None
    return DeviceCeilings(
        bandwidth_tbps=2 * copy_bytes / copy_ms / 1e9,
        bf16_tflops=flops / bf16_ms / 1e9,
        fp8_tflops=fp8_tflops,
    )


def gpu_key(device_index: int = 0) -> str:
    """What a cached measurement of GPU device_index is filed under: its name and UUID, and the
    torch and CUDA versions that measured it."""
    props = torch.cuda.get_device_properties(device_index)
    uuid = getattr(props, "uuid", "")
    return f"{props.name} {uuid} torch {torch.__version__} cuda {torch.version.cuda}"


def cached_ceilings(
    key: str,
    measure: Callable[[], DeviceCeilings],
    *,
    folder: Path | None = None,
    max_age_s: float = CEILINGS_MAX_AGE_S,
) -> DeviceCeilings:
    """The ceilings filed under key (gpu_key) in folder (default cache_dir()/ceilings) when they
    are younger than max_age_s, else measure() filed there. Measuring costs seconds a tune would
    wait for (cuBLAS starting, above all); a file that cannot be read or written is measured
    past, never an error. One file per key, so that a host's GPU processes never share one."""
    folder = folder if folder is not None else cache_dir() / "ceilings"
    path = folder / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")
    try:
        data = json.loads(path.read_text())
        if data["key"] == key and 0 <= time.time() - data["measured_at"] <= max_age_s:
            return DeviceCeilings(**data["ceilings"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    ceilings = measure()
    record = {"key": key, "measured_at": time.time(), "ceilings": asdict(ceilings)}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(record) + "\n")
        partial.replace(path)
    except OSError:
        pass
    return ceilings


def moe_floor_us(shape: KernelShape, M: int, ceilings: DeviceCeilings) -> float:
    """The layer's floor in µs: max(bytes / bandwidth, FLOPs / matrix rate).

    bytes: the weights of the experts routed to (expected count under uniform routing,
    E·(1 − (1 − top_k/E)^M)) with their scales, x and out (bf16), router ids and weights.
    FLOPs: 2·M·top_k·(2N·H + H·N).
    """
    return _floor_us(shape, M, ceilings, _floor_bytes(shape, M))


def layout_floor_us(shape: KernelShape, M: int, ceilings: DeviceCeilings) -> float:
    """The floor of the engines' kernel layout, in µs: moe_floor_us with the bytes that layout
    moves through memory besides: gate and up [M·top_k, 2N] (bf16) GEMM 1 writes and the
    activation kernel reads, the activation [M·top_k, N] it writes and GEMM 2 reads, each pair's
    row [M·top_k, H] (bf16) GEMM 2 writes and the top-k sum reads (top_k > 1), and in fp8 x's
    quantised copy. Where it is far above moe_floor_us, no config of this kernel comes near the
    floor."""
    pairs = M * shape.top_k
    fp8 = shape.dtype == "fp8_w8a8"
    gate_up_row = 2 * shape.N * 2
    act_row = shape.N * (1 if fp8 else 2)
    x_copy = 0
    if fp8:
        groups = -(-shape.N // shape.block_shape[1]) if shape.block_shape else 0
        act_row += 4 * groups
        x_copy = 2 * M * shape.H
    rows = 2 * pairs * shape.H * 2 if shape.top_k > 1 else 0
    extra = 2 * pairs * (gate_up_row + act_row) + rows + x_copy
    return _floor_us(shape, M, ceilings, _floor_bytes(shape, M) + extra)


def _floor_bytes(shape: KernelShape, M: int) -> float:
    N, H, k = shape.N, shape.H, shape.top_k
    expert_bytes = 3 * N * H * shape.operand_bytes
    if shape.dtype == "fp8_w8a8" and shape.block_shape:
        bn, bk = shape.block_shape
        expert_bytes += 4 * (-(-2 * N // bn) * -(-H // bk) + -(-H // bn) * -(-N // bk))
    elif shape.dtype == "fp8_w8a8":
        expert_bytes += 8
    activation_bytes = 2 * M * H * 2 + M * k * 8
    return routed_experts(shape, M) * expert_bytes + activation_bytes


def _floor_us(shape: KernelShape, M: int, ceilings: DeviceCeilings, total_bytes: float) -> float:
    flops = 2 * M * shape.top_k * 3 * shape.N * shape.H
    memory_s = total_bytes / (ceilings.bandwidth_tbps * 1e12)
    matrix_s = flops / (ceilings.matrix_tflops(shape.dtype) * 1e12)
    return max(memory_s, matrix_s) * 1e6


def routed_experts(shape: KernelShape, M: int) -> float:
    """Experts M tokens are expected to reach under uniform routing: E·(1 − (1 − k/E)^M)."""
    return shape.E * (1 - (1 - shape.top_k / shape.E) ** M)


def _copy_ms(copy_bytes: int) -> float:
    src = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    return _median_ms(lambda: dst.copy_(src))


def _median_ms(run: Callable[[], object], warmup: int = 3, repeats: int = 10) -> float:
    for _ in range(warmup):
        run()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for s, e in zip(starts, ends, strict=True):
        s.record()
        run()
        e.record()
    torch.cuda.synchronize()
    return float(np.median([s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]))
