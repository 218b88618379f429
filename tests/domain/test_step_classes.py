"""The kernel/op-name rule tables against the engines they claim (drift): every rule's pattern
matches the name it gives as an example and is the first rule to match it, and every rule's
source string is still in the engine's Python.

vLLM 0.32's code is the CPU build of tests/engine (var/engine); vLLM 0.33 and 0.34 and SGLang
0.5.23 come from their wheels (tests.engine.engine_source downloads each once into
var/engine/wheels), read as they lie in the wheel.
"""

import re
import zipfile
from functools import cache

import pytest

from domain.step_classes import SGLANG_GPU, TABLES, VLLM_CPU, VLLM_GPU, rule_table
from tests.engine import ENGINE_DIR, engine_source, ensure_installed
from tuning.engine_source import locate_package


@cache
def _engine_python(engine: str, version: str) -> str:
    """Every .py file of the engine's package, as one text."""
    if (engine, version) == ("vllm", "0.32.0"):
        folder = locate_package("vllm", python=str(ensure_installed())).package_dir
        return "\n".join(p.read_text(errors="replace") for p in sorted(folder.rglob("*.py")))
    engine_source(engine, version)  # fetches the wheel
    (wheel,) = (ENGINE_DIR / "wheels").glob(f"{engine}-{version}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return "\n".join(
            archive.read(name).decode(errors="replace")
            for name in archive.namelist()
            if name.startswith(f"{engine}/") and name.endswith(".py")
        )


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_every_rule_matches_its_example_first(table):
    for index, rule in enumerate(table.rules):
        assert re.search(rule.pattern, rule.example), (rule.pattern, rule.example)
        first = next(i for i, r in enumerate(table.rules) if re.search(r.pattern, rule.example))
        assert first == index, f"{rule.example} is taken by {table.rules[first].pattern}"
        assert table.classify(rule.example) == rule.klass


@pytest.mark.parametrize(
    ("table", "version"),
    [
        (VLLM_GPU, "0.32.0"),
        (VLLM_GPU, "0.33.0"),
        (VLLM_GPU, "0.34.0"),
        (VLLM_CPU, "0.32.0"),
        (SGLANG_GPU, "0.5.23"),
    ],
    ids=lambda v: v if isinstance(v, str) else v.name,
)
def test_every_rule_source_is_in_the_engine(table, version):
    assert rule_table(table.engine, version, table.device) is table
    text = _engine_python(table.engine, version)
    missing = [(r.klass, r.source) for r in table.rules if r.source not in text]
    assert not missing, f"{table.engine} {version} no longer has: {missing}"


def test_a_name_of_no_rule_is_left_to_the_caller():
    assert VLLM_GPU.classify("my_own_kernel") is None
    assert VLLM_CPU.classify("aten::pow") is None
    assert rule_table("vllm", "0.31.0", "gpu") is None
    assert rule_table("vllm", "0.33.2", "gpu") is VLLM_GPU
