"""The routings a tune times under (tuning.routing): uniform, Zipf, Dirichlet, a file of ids."""

import json

import numpy as np
import pytest

from tuning.routing import (
    UNIFORM,
    Routing,
    RoutingError,
    draw_ids,
    hottest_share,
    load_ids,
    parse_routing,
)

E, TOP_K = 256, 8


def _distinct_and_in_range(ids):
    assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < E
    ordered = np.sort(ids, axis=-1)
    assert not (ordered[..., 1:] == ordered[..., :-1]).any()


def test_zipf_makes_a_few_experts_hot_the_same_ones_in_every_set():
    zipf = parse_routing("zipf:1.2")

    ids = draw_ids(zipf, 4, 512, E, TOP_K, seed=3)

    assert ids.shape == (4, 512, TOP_K)
    _distinct_and_in_range(ids)
    # uniform gives each expert 1/256 of the rows; Zipf 1.2's hottest takes ten times that
    assert hottest_share(ids, E) > 10 / E
    hottest = [np.bincount(s.reshape(-1), minlength=E).argmax() for s in ids]
    assert len(set(hottest)) == 1
    assert (draw_ids(zipf, 4, 512, E, TOP_K, seed=3) == ids).all()
    assert zipf.label == "Zipf 1.2" and Routing.from_dict(zipf.as_dict()) == zipf


def test_a_small_dirichlet_concentration_moves_the_hot_experts_from_set_to_set():
    ids = draw_ids(parse_routing("dirichlet:0.05"), 6, 256, E, TOP_K, seed=1)

    _distinct_and_in_range(ids)
    hottest = [np.bincount(s.reshape(-1), minlength=E).argmax() for s in ids]
    assert len(set(hottest)) > 1
    assert min(hottest_share(s, E) for s in ids) > 10 / E


def test_a_file_of_ids_is_read_as_engines_dump_them_and_wraps_round(tmp_path):
    tokens = np.array([[(t + j) % E for j in range(TOP_K)] for t in range(10)])
    np.save(tmp_path / "layer.npy", tokens)
    np.save(tmp_path / "layers.npy", np.stack([tokens, tokens]))
    np.savez(tmp_path / "dump.npz", topk_ids=tokens, weights=np.ones((10, TOP_K)))
    lines = [json.dumps(tokens[:4].tolist())] + [json.dumps(t.tolist()) for t in tokens[4:]]
    (tmp_path / "run.jsonl").write_text("\n".join(lines) + "\n")

    for name, count in [("layer.npy", 10), ("layers.npy", 20), ("dump.npz", 10), ("run.jsonl", 10)]:
        ids = load_ids(tmp_path / name, E, TOP_K)
        assert ids.shape == (count, TOP_K) and (ids[:10] == tokens).all()

    routing = parse_routing(str(tmp_path / "run.jsonl"))
    drawn = draw_ids(routing, 3, 25, E, TOP_K, seed=0)
    assert drawn.shape == (3, 25, TOP_K)
    for draw in drawn:
        start = int(np.flatnonzero((tokens == draw[0]).all(axis=1))[0])
        assert (draw == tokens[(start + np.arange(25)) % 10]).all()
    assert routing.label == "top-k ids from run.jsonl" and len(routing.sha256) == 64


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        (
            "wide.npy",
            np.zeros((4, 6), dtype=np.int64) + np.arange(6),
            "picks 6 experts, the model 8",
        ),
        ("far.npy", np.arange(8)[None, :] * 40, "expert ids run 0..280, the layer has 0..255"),
        ("twice.npy", np.array([list(range(8)), [1] * 8]), "token 1 names an expert twice"),
        ("float.npy", np.zeros((2, 8)), "expert ids must be integers, got float64"),
        ("flat.npy", np.arange(8), "are [tokens, top_k] or [layers, tokens, top_k], got shape [8]"),
        ("empty.npy", np.zeros((0, 8), dtype=np.int32), "no tokens"),
        ("bad.jsonl", "[[0, 1], [2]]\n", "a token of 1 experts after tokens of 2"),
        ("text.jsonl", '[["a"]]\n', 'a token is a list of expert ids, got ["a"]'),
        ("junk.jsonl", "{not json\n", "line 1 is not JSON"),
        ("many.npz", {"a": np.zeros((1, 8)), "b": np.zeros((1, 8))}, "holds 2 arrays (a, b)"),
    ],
)
def test_a_file_that_is_not_top_k_ids_is_refused_naming_what_is_wrong(
    tmp_path, name, content, said
):
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content)
    elif isinstance(content, dict):
        np.savez(path, **content)
    else:
        np.save(path, content)

    with pytest.raises(RoutingError) as refused:
        load_ids(path, E, TOP_K)

    assert str(refused.value).startswith(f"{name}: ") and said in str(refused.value)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("zipf:0", "the exponent must be a number in (0, 8]"),
        ("zipf:x", "zipf:x: the exponent"),
        ("dirichlet:-1", "the concentration must be a number in [0.001, 1000]"),
        ("hot", "a routing is uniform, zipf:S, dirichlet:A or a file of top-k ids"),
        ("missing.npy", "missing.npy: cannot read it"),
    ],
)
def test_a_routing_it_cannot_time_under_is_refused(text, said):
    with pytest.raises(RoutingError, match=None) as refused:
        parse_routing(text)
    assert said in str(refused.value)


def test_uniform_is_todays_routing_and_what_old_logs_read_as():
    assert parse_routing("uniform") == UNIFORM == Routing.from_dict({}) == Routing.from_dict(None)
    assert UNIFORM.label == "uniform" and UNIFORM.as_dict() == {"kind": "uniform"}


def test_a_tune_records_its_routing_and_resumes_only_a_log_of_the_same(tmp_path, capsys):
    from tests.fakes import SHAPE, FakeMeasurements
    from tuning.tune_results import TuneResult, print_summary
    from tuning.tuner import Tuner

    measurements = FakeMeasurements()
    measurements.routing = parse_routing("zipf:1.2")
    log = tmp_path / "log.json"

    skewed = Tuner(SHAPE, measurements).tune([64], resume_path=log)

    assert skewed.routing == {"kind": "zipf", "parameter": 1.2}
    assert TuneResult.from_dict(skewed.to_dict()).routing == skewed.routing
    print_summary(skewed)
    assert "timed under Zipf 1.2 routing" in capsys.readouterr().out
    uniform = Tuner(SHAPE, FakeMeasurements()).tune([64])
    assert uniform.routing == {"kind": "uniform"} and not uniform.same_run_as(skewed)
    # a log written before routings were recorded is a uniform one
    old = {k: v for k, v in uniform.to_dict().items() if k != "routing"}
    assert TuneResult.from_dict(old).same_run_as(uniform)


def test_the_tune_cli_refuses_a_routing_file_not_of_the_models_shape_before_any_gpu_work(
    tmp_path, capsys
):
    from tests.fakes import HF_CONFIGS
    from tuning.__main__ import main

    wrong = tmp_path / "dump.npy"
    np.save(wrong, np.zeros((16, 4), dtype=np.int32) + np.arange(4))
    glm5 = ["--model-config", str(HF_CONFIGS / "glm-5-fp8_config.json"), "--tp", "8"]

    status = main(["tune", *glm5, "--out", str(tmp_path), "--routing", str(wrong)])

    assert status == 2
    assert "dump.npy: each token picks 4 experts, the model 8" in capsys.readouterr().err


def test_the_timers_router_choices_follow_the_routing():
    import torch

    from tuning.timing import random_routing, routed

    zipf = parse_routing("zipf:1.2")
    weights, ids = routed(zipf, 4, 256, E, TOP_K, device="cpu", seed=2)

    assert ids.dtype == torch.int32 and tuple(ids.shape) == (4, 256, TOP_K)
    assert (ids.numpy() == draw_ids(zipf, 4, 256, E, TOP_K, seed=2)).all()
    assert tuple(weights.shape) == (4, 256, TOP_K) and weights.dtype == torch.float32
    same = random_routing(4, 256, E, TOP_K, device="cpu", seed=2)
    uniform = routed(None, 4, 256, E, TOP_K, device="cpu", seed=2)
    assert all((a == b).all() for a, b in zip(uniform, same, strict=True))


def test_the_bench_refuses_a_routing_it_cannot_time_under(capsys):
    from tests.fakes import HF_CONFIGS
    from tuning.__main__ import main

    glm5 = ["--model-config", str(HF_CONFIGS / "glm-5-fp8_config.json"), "--tp", "8"]

    assert main(["bench", *glm5, "--routing", "dirichlet:0"]) == 2
    assert "dirichlet:0: the concentration must be a number" in capsys.readouterr().err


class SkewedMeasurements:
    """FakeMeasurements tuning under Zipf 1.2, whose timers under another routing note it and
    run every config 10 % slower than the tune's."""

    def __new__(cls):
        from tests.fakes import FakeMeasurements, FakeTimer

        class Timer(FakeTimer):
            def __init__(self, measurements, M, routing):
                super().__init__(measurements, M)
                self.routing = routing

            def time_config(self, config, replays, calls=None, *, down_config=None):
                us = super().time_config(config, replays, calls, down_config=down_config)
                return us if self.routing is None else us * 1.1

        class Measurements(FakeMeasurements):
            routing = parse_routing("zipf:1.2")

            def __init__(self):
                super().__init__()
                self.timers_under = []

            def timer(self, M, routing=None):
                if routing is not None:
                    self.timers_under.append((M, routing.kind))
                return Timer(self, M, routing)

        return Measurements()


def test_a_skewed_tune_times_its_file_and_the_engines_own_under_uniform_routing_too(capsys):
    from tests.fakes import SHAPE
    from tuning.tune_results import TuneResult, print_summary
    from tuning.tuner import Tuner

    measurements = SkewedMeasurements()

    result = Tuner(SHAPE, measurements).tune([64, 1024])

    assert measurements.timers_under == [(64, "uniform"), (1024, "uniform")]
    for batch in result.batches.values():
        under = batch.also_under
        assert under["routing"] == {"kind": "uniform"}
        assert under["tuned_us"] > batch.tuned_us and under["default_us"] > 0
    assert TuneResult.from_dict(result.to_dict()).batches[64].also_under == (
        result.batches[64].also_under
    )
    # a uniform tune is timed under nothing else unless asked
    from tests.fakes import FakeMeasurements

    assert Tuner(SHAPE, FakeMeasurements()).tune([64]).batches[64].also_under is None
    print_summary(result)


def test_where_the_written_file_loses_under_the_other_routing_is_said():
    from tests.fakes import SHAPE
    from tuning.tune_results import BatchResult, TuneResult, losses_under_other_routing

    def batch(m, tuned, default, shipped):
        under = {"routing": {"kind": "zipf", "parameter": 1.2}, "tuned_us": tuned}
        under.update(default_us=default, shipped_us=shipped)
        return BatchResult(m, {}, 1.0, 1.0, 1.0, 1, also_under=under)

    result = TuneResult(SHAPE, "NVIDIA H200", "3.6.0", "coarse-to-fine", {})
    result.batches = {
        64: batch(64, 109.0, 100.0, 120.0),
        256: batch(256, 101.0, 100.0, None),
        1024: batch(1024, 90.0, 100.0, 95.0),
    }

    assert losses_under_other_routing(result) == ["loses 9 % at M=64 under Zipf 1.2"]
