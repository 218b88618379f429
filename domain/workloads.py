"""Workloads: what a sweep sends, as both tiers read it.

The web tier checks a workload's spec and parses an uploaded dataset file into its compact form
(`parse_dataset`); the worker draws each request's lengths and prompt from them
(workers.loadgen). A spec is plain JSON:

    {"kind": "random", "input": LENGTH, "output": LENGTH}
    {"kind": "dataset", "output": LENGTH | None}          (+ the file's items)
    {"kind": "shared_prefix", "groups": G, "prefix_len": P, "question_len": Q, "output": LENGTH}
    {"kind": "multi_turn", "turns": T, "question_len": Q, "output": LENGTH, "think_time_s": s}
    {"kind": "multi_turn", "from_file": true, "turns": T | None, "output": LENGTH | None,
     "think_time_s": s}                                 (+ the file's conversations)
    {"kind": "trace", "block_size": B, "speed": x}      (+ the trace's requests)

and a LENGTH is {"distribution": "fixed", "value": n}, {"distribution": "uniform", "low": a,
"high": b} (both inclusive) or {"distribution": "normal", "mean": m, "std": s, "low": a,
"high": b} (clamped to [a, b]); lengths are tokens. docs/metrics.md, "Workloads", says how
vLLM's and SGLang's --random-range-ratio map onto a uniform LENGTH (`range_ratio_length`).

A trace (a Mooncake-format file, `parse_trace`) is replayed request by request at its
timestamps divided by `speed`, each prompt built of `block_size`-token blocks, one per hash id.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np

from domain.json_lines import array_lines

KINDS = ("random", "dataset", "shared_prefix", "multi_turn", "trace")
DISTRIBUTIONS = ("fixed", "uniform", "normal")
RANGE_RATIO_CONVENTIONS = ("vllm", "sglang")
# Far beyond any context window (Llama 4 Scout: 10 M tokens); RunParameters bounds lengths alike.
MAX_LENGTH = 1 << 24
MAX_GROUPS = 4096
MAX_TURNS = 64
MAX_THINK_TIME_S = 600.0
# A dataset file bigger than this is refused by its size, before it is read: the API's body
# limit (MOEOPS_MAX_BODY_BYTES, 16 MiB by default) holds a file of this size in its JSON.
MAX_DATASET_BYTES = 8 * 1024 * 1024
MAX_DATASET_ITEMS = 100_000
LAYOUTS = ("sharegpt", "messages", "mtbench", "prompts")
HUMAN_ROLES = ("human", "user")
SYSTEM_ROLES = ("system",)
ANSWER_ROLES = ("gpt", "assistant", "chatgpt", "bard", "bing")
# Every whitespace-separated word is at least one token for the tokenizers of the engines' models
# (their pre-tokenizers split on whitespace): the word count is a lower bound of a prompt's tokens.
_WORD = re.compile(r"\S+")


# What names the workload a run sent: runs of two workloads are never compared as if they
# differed in one factor (the snapshot's "workload", the regression's comparable key).
WORKLOAD_KEYS = ("name", "version", "kind", "sha256")


def workload_identity(named) -> dict:
    """WORKLOAD_KEYS of a run's `workload` parameter (Workload.run_parameter); a run that names
    none sent random ids of its fixed lengths."""
    if not isinstance(named, dict):
        return {"name": None, "version": None, "kind": "random", "sha256": None}
    return {k: named.get(k) for k in WORKLOAD_KEYS}


class WorkloadError(ValueError):
    """A spec that cannot be sent; the message names the key."""


class DatasetFileError(ValueError):
    """A dataset file refused: the message names the file, the line and the reason."""

    def __init__(self, file_name: str, line: int | None, reason: str):
        self.file_name = file_name
        self.line = line
        self.reason = reason
        where = f"{file_name}, line {line}" if line is not None else file_name
        super().__init__(f"{where}: {reason}")


# ---------------------------------------------------------------------------------------------
# Lengths
# ---------------------------------------------------------------------------------------------


def _int_in(data: dict, key: str, where: str, low: int = 1, high: int = MAX_LENGTH) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise WorkloadError(f"{where}.{key}: a whole number from {low} to {high:,}, got {value!r}")
    return value


def _number_in(data: dict, key: str, where: str, low: float, high: float) -> float:
    value = data.get(key)
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not low <= value <= high:
        raise WorkloadError(f"{where}.{key}: a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def length_checked(data, where: str) -> dict:
    """The LENGTH `data` as stored (only its own keys); raises WorkloadError naming `where`."""
    if not isinstance(data, dict):
        raise WorkloadError(f"{where}: an object with a distribution, got {data!r}")
    distribution = data.get("distribution")
    if distribution == "fixed":
        return {"distribution": "fixed", "value": _int_in(data, "value", where)}
    if distribution in ("uniform", "normal"):
        low = _int_in(data, "low", where)
        high = _int_in(data, "high", where)
        if low > high:
            raise WorkloadError(f"{where}: low ({low}) is above high ({high})")
        if distribution == "uniform":
            return {"distribution": "uniform", "low": low, "high": high}
        mean = _number_in(data, "mean", where, 1, MAX_LENGTH)
        std = _number_in(data, "std", where, 0, MAX_LENGTH)
        return {"distribution": "normal", "mean": mean, "std": std, "low": low, "high": high}
    raise WorkloadError(
        f"{where}.distribution: one of {', '.join(DISTRIBUTIONS)}, got {distribution!r}"
    )


def range_ratio_length(length: int, ratio: float, convention: str) -> dict:
    """The uniform LENGTH of `vllm bench serve` or SGLang's bench_serving for --random-input-len
    (or -output-len) `length` and --random-range-ratio `ratio`.

    vLLM: ratio in [0, 1), lengths uniform over [floor(L·(1−r)), ceil(L·(1+r))], at least 1.
    SGLang: ratio in [0, 1], lengths uniform over [int(L·r), L], at least 1. Raises WorkloadError
    for a ratio outside the engine's range.
    """
    if convention == "vllm":
        if not 0 <= ratio < 1:
            raise WorkloadError(f"range_ratio: vLLM's is in [0, 1), got {ratio}")
        low, high = math.floor(length * (1 - ratio)), math.ceil(length * (1 + ratio))
    elif convention == "sglang":
        if not 0 <= ratio <= 1:
            raise WorkloadError(f"range_ratio: SGLang's is in [0, 1], got {ratio}")
        low, high = int(length * ratio), length
    else:
        raise WorkloadError(
            f"range_ratio_convention: one of {', '.join(RANGE_RATIO_CONVENTIONS)}, got "
            f"{convention!r}"
        )
    low, high = max(low, 1), max(high, 1)
    if low == high:
        return {"distribution": "fixed", "value": low}
    return {"distribution": "uniform", "low": low, "high": min(high, MAX_LENGTH)}


def draw_length(length: dict, rng: np.random.Generator) -> int:
    """One length (tokens) from a checked LENGTH."""
    distribution = length["distribution"]
    if distribution == "fixed":
        return length["value"]
    if distribution == "uniform":
        return int(rng.integers(length["low"], length["high"] + 1))
    value = round(rng.normal(length["mean"], length["std"]))
    return int(min(max(value, length["low"]), length["high"]))


def length_mean(length: dict) -> float:
    """A LENGTH's mean in tokens (a clamped normal's is taken as its mean inside the clamp)."""
    if length["distribution"] == "fixed":
        return float(length["value"])
    if length["distribution"] == "uniform":
        return (length["low"] + length["high"]) / 2
    return min(max(length["mean"], length["low"]), length["high"])


def length_label(length: dict) -> str:
    """ "1024", "512–1536 uniform", "normal 1024 ± 256 in 128–4096"."""
    if length["distribution"] == "fixed":
        return str(length["value"])
    if length["distribution"] == "uniform":
        return f"{length['low']}–{length['high']} uniform"
    return f"normal {length['mean']:g} ± {length['std']:g} in {length['low']}–{length['high']}"


# ---------------------------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------------------------


def spec_checked(spec) -> dict:
    """The spec as stored: its kind's keys, each checked; raises WorkloadError naming the key."""
    if not isinstance(spec, dict):
        raise WorkloadError(f"spec: an object with a kind, got {spec!r}")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise WorkloadError(f"kind: one of {', '.join(KINDS)}, got {kind!r}")
    out: dict = {"kind": kind}
    if kind == "trace":
        return trace_spec_checked(spec)
    if kind == "random":
        out["input"] = length_checked(spec.get("input"), "input")
    if kind == "shared_prefix":
        out["groups"] = _int_in(spec, "groups", "spec", 1, MAX_GROUPS)
        out["prefix_len"] = _int_in(spec, "prefix_len", "spec")
    from_file = kind == "multi_turn" and spec.get("from_file") is True
    if from_file:
        # the file's conversations give the questions; turns, when set, caps each conversation
        out["from_file"] = True
        out["turns"] = (
            None if spec.get("turns") is None else _int_in(spec, "turns", "spec", 1, MAX_TURNS)
        )
    elif kind == "multi_turn":
        out["turns"] = _int_in(spec, "turns", "spec", 1, MAX_TURNS)
    if kind == "multi_turn":
        out["think_time_s"] = _number_in(
            {"think_time_s": spec.get("think_time_s", 0.0)},
            "think_time_s",
            "spec",
            0,
            MAX_THINK_TIME_S,
        )
    if kind == "shared_prefix" or (kind == "multi_turn" and not from_file):
        out["question_len"] = _int_in(spec, "question_len", "spec")
    if (kind == "dataset" or from_file) and spec.get("output") is None:
        out["output"] = None
    else:
        out["output"] = length_checked(spec.get("output"), "output")
    return out


# A trace's block: AIPerf reads a Mooncake trace's hash ids as blocks of 512 tokens.
DEFAULT_BLOCK_SIZE = 512
MAX_BLOCK_SIZE = 1 << 16
# 2× replays the trace twice as fast; far from either end a replay measures nothing of the trace.
MIN_SPEED, MAX_SPEED = 0.01, 1000.0


def trace_spec_checked(spec: dict) -> dict:
    """A trace's spec as stored: block_size (tokens per hash id, DEFAULT_BLOCK_SIZE when not
    given), speed (the factor the timestamps are divided by, 1 when not given)."""
    block = spec.get("block_size", DEFAULT_BLOCK_SIZE)
    speed = spec.get("speed", 1.0)
    return {
        "kind": "trace",
        "block_size": _int_in({"block_size": block}, "block_size", "spec", 1, MAX_BLOCK_SIZE),
        "speed": _number_in({"speed": speed}, "speed", "spec", MIN_SPEED, MAX_SPEED),
    }


def spec_label(spec: dict) -> str:
    """A workload spec in a few words, for pages."""
    kind = spec["kind"]
    output = f"output {length_label(spec['output'])}" if spec.get("output") else None
    if kind == "random":
        parts = [f"input {length_label(spec['input'])}", output]
    elif kind == "dataset":
        parts = ["prompts from the file", output or "output from the file's answers"]
    elif kind == "shared_prefix":
        parts = [
            f"{spec['groups']} groups of a {spec['prefix_len']}-token prefix",
            f"{spec['question_len']}-token questions",
            output,
        ]
    elif kind == "trace":
        parts = [
            "the trace's requests at their timestamps"
            + (f" {spec['speed']:g}× as fast" if spec["speed"] != 1 else ""),
            f"{spec['block_size']}-token blocks per hash id",
            "lengths from the trace",
        ]
    elif spec.get("from_file"):
        cap = f", at most {spec['turns']} turns each" if spec.get("turns") else ""
        parts = [
            f"the file's conversations, every turn{cap}",
            output or "output from the file's answers",
            f"{spec['think_time_s']:g} s think time",
        ]
    else:
        parts = [
            f"{spec['turns']} turns of {spec['question_len']}-token questions",
            output,
            f"{spec['think_time_s']:g} s think time",
        ]
    return ", ".join(p for p in parts if p)


# ---------------------------------------------------------------------------------------------
# Dataset files
# ---------------------------------------------------------------------------------------------


def _text_of(data: bytes, file_name: str, kind: str) -> str:
    """The file's text, refused when it is past MAX_DATASET_BYTES (what `kind` of file, "a
    trace", may hold), empty, binary or not UTF-8."""
    if len(data) > MAX_DATASET_BYTES:
        raise DatasetFileError(
            file_name,
            None,
            f"{len(data):,} bytes, more than {kind} may hold ({MAX_DATASET_BYTES:,})",
        )
    if not data.strip():
        raise DatasetFileError(file_name, None, "the file is empty")
    if b"\x00" in data:
        line = data[: data.index(b"\x00")].count(b"\n") + 1
        raise DatasetFileError(file_name, line, "a NUL byte: the file is binary, not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DatasetFileError(
            file_name, line, f"byte 0x{data[exc.start]:02x} is not UTF-8: the file is not text"
        ) from None


def _conversation(
    obj, file_name: str, line: int
) -> tuple[str, list[tuple[str, str | None]], str | None]:
    """(layout, [(human turn, the answer after it or None), …], system prompt or None) of one
    conversation object: ShareGPT, OpenAI messages or an MT-bench question (its turns, none
    answered). The system prompt is the first system turn's text, sent before the first
    question on the chat endpoint."""
    if not isinstance(obj, dict):
        raise DatasetFileError(
            file_name, line, "not a conversation: an object with conversations or messages"
        )
    if isinstance(obj.get("conversations"), list):
        turns = [
            (t.get("from"), t.get("value")) for t in obj["conversations"] if isinstance(t, dict)
        ]
        key, layout = "conversations", "sharegpt"
    elif isinstance(obj.get("messages"), list):
        turns = [(t.get("role"), t.get("content")) for t in obj["messages"] if isinstance(t, dict)]
        key, layout = "messages", "messages"
    elif isinstance(obj.get("turns"), list):
        turns = [("user", t) for t in obj["turns"]]
        key, layout = "turns", "mtbench"
    else:
        raise DatasetFileError(
            file_name,
            line,
            'neither a ShareGPT conversation ({"conversations": [{"from", "value"}]}), OpenAI '
            'messages ({"messages": [{"role", "content"}]}) nor an MT-bench question '
            '({"question_id", "turns": [questions]})',
        )
    pairs: list[tuple[str, str | None]] = []
    for i, (role, text) in enumerate(turns):
        if role in HUMAN_ROLES:
            if not isinstance(text, str) or not text.strip():
                which = "the first human turn" if not pairs else f"human turn {len(pairs) + 1}"
                raise DatasetFileError(file_name, line, f"{which} of {key} is empty")
            # the answer is the first one before the next human turn
            answer = None
            for r, a in turns[i + 1 :]:
                if r in HUMAN_ROLES:
                    break
                if r in ANSWER_ROLES and isinstance(a, str):
                    answer = a
                    break
            pairs.append((text, answer))
    if not pairs:
        raise DatasetFileError(file_name, line, f"a conversation with no human turn in its {key}")
    system = next(
        (text for role, text in turns if role in SYSTEM_ROLES and isinstance(text, str)), None
    )
    return layout, pairs, system if system and system.strip() else None


def _json_items(text: str, file_name: str):
    """(line, object) of each conversation of a JSON array or a JSONL file."""
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetFileError(file_name, exc.lineno, f"not JSON: {exc.msg}") from None
        yield from zip(array_lines(text, len(items)), items, strict=True)
        return
    yield from json_lines(text, file_name)


def json_lines(text: str, file_name: str):
    """(line, object) of each non-blank line of a JSONL file; a line that is not JSON is
    refused naming it."""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetFileError(
                file_name, number, f"not a JSON object (JSONL): {exc.msg}, at column {exc.colno}"
            ) from None
        except ValueError as exc:
            # Python's own limit on an integer's digits (4,300), met before any key is read
            raise DatasetFileError(file_name, number, f"not a JSON object (JSONL): {exc}") from None
        yield number, obj


def _word_count(text: str) -> int:
    return sum(1 for _ in _WORD.finditer(text))


def parse_dataset(file_name: str, data: bytes, *, context_len: int | None = None) -> dict:
    """The compact form of a dataset file: {"layout", "items": [{"prompt", "answer"[, "turns"]}]}.

    Layouts: ShareGPT (a JSON array or JSONL of {"conversations": [{"from": "human"|"gpt",
    "value"}]}), OpenAI messages JSONL ({"messages": [{"role", "content"}]}), MT-bench questions
    ({"question_id", "category", "turns": [questions]} a line), or plain prompts, one per line.
    Each conversation gives its first human turn as the prompt and the answer after it (None
    where there is none: MT-bench, plain prompts); one of several human turns also keeps them
    all as "turns": [[question, answer or None], …] (conversation_of reads either); one with a
    system turn keeps its text as "system" (sent first on the chat endpoint). context_len
    (tokens): a question of more words than that is refused (each word is at least one token).
    Raises
    DatasetFileError naming the file, the line and the reason; nothing of a refused file is kept.
    """
    text = _text_of(data, file_name, "a dataset")
    first = text.lstrip()[:1]
    items = []
    if first in ("[", "{"):
        layout = None
        for line, obj in _json_items(text, file_name):
            layout_of, pairs, system = _conversation(obj, file_name, line)
            layout = layout or layout_of
            items.append((line, pairs, system))
    else:
        layout = "prompts"
        items = [
            (number, [(line.strip(), None)], None)
            for number, line in enumerate(text.splitlines(), 1)
            if line.strip()
        ]
    if not items:
        raise DatasetFileError(file_name, None, "the file holds no conversation and no prompt")
    if len(items) > MAX_DATASET_ITEMS:
        raise DatasetFileError(
            file_name, items[MAX_DATASET_ITEMS][0], f"more than {MAX_DATASET_ITEMS:,} prompts"
        )
    if context_len is not None:
        for line, pairs, _ in items:
            for turn, (question, _) in enumerate(pairs, 1):
                words = _word_count(question)
                if words > context_len:
                    what = "the prompt" if turn == 1 else f"turn {turn}'s question"
                    raise DatasetFileError(
                        file_name,
                        line,
                        f"{what} has at least {words:,} tokens (its words), over the context "
                        f"length of {context_len:,}",
                    )
    return {"layout": layout, "items": [_item(pairs, system) for _, pairs, system in items]}


def _item(pairs: list[tuple[str, str | None]], system: str | None) -> dict:
    item = {"prompt": pairs[0][0], "answer": pairs[0][1]}
    if len(pairs) > 1:
        item["turns"] = [[question, answer] for question, answer in pairs]
    if system:
        item["system"] = system
    return item


def answer_words(spec: dict, items: list[dict]) -> tuple[list[int], int]:
    """([words of each answer the workload sends as an output length], turns without one) of a
    workload whose output lengths come from its file: a dataset's first turns, a multi-turn
    workload's every turn (at most its spec's turns). ([], 0) when the spec sets the output."""
    if spec.get("output") or not items or spec.get("kind") == "trace":
        return [], 0
    cap = spec.get("turns") if spec.get("from_file") else 1
    answered, unanswered = [], 0
    for item in items:
        for _, answer in conversation_of(item)[: cap or None]:
            if answer and answer.split():
                answered.append(_word_count(answer))
            else:
                unanswered += 1
    return answered, unanswered


def conversation_of(item: dict) -> list[tuple[str, str | None]]:
    """[(question, answer or None), …]: every human turn of a stored dataset item, in order."""
    if item.get("turns"):
        return [(question, answer) for question, answer in item["turns"]]
    return [(item["prompt"], item.get("answer"))]


# ---------------------------------------------------------------------------------------------
# Lengths written as text (the page's form, the command line)
# ---------------------------------------------------------------------------------------------

_RANGE = r"(\d+)\s*[-–]\s*(\d+)"
_NUMBER = r"(\d+(?:\.\d+)?)"
LENGTH_SYNTAX = (
    '"1024" (fixed), "512-1536" (uniform, both ends included), "normal 1024 256 128-4096" '
    '(mean, std, clamped to the range), or "1024 ratio 0.5 vllm" / "1024 ratio 0.5 sglang" '
    "(the engine's --random-range-ratio)"
)


def parse_length(text: str, where: str) -> dict:
    """A LENGTH from its text (LENGTH_SYNTAX); raises WorkloadError naming `where`."""
    words = " ".join(str(text).split()).lower()
    if re.fullmatch(r"\d+", words):
        return length_checked({"distribution": "fixed", "value": int(words)}, where)
    if m := re.fullmatch(_RANGE, words):
        return length_checked(
            {"distribution": "uniform", "low": int(m[1]), "high": int(m[2])}, where
        )
    if m := re.fullmatch(rf"normal {_NUMBER} {_NUMBER} {_RANGE}", words):
        spec = {"distribution": "normal", "mean": float(m[1]), "std": float(m[2])}
        return length_checked({**spec, "low": int(m[3]), "high": int(m[4])}, where)
    if m := re.fullmatch(rf"(\d+) ratio {_NUMBER} (vllm|sglang)", words):
        try:
            return length_checked(range_ratio_length(int(m[1]), float(m[2]), m[3]), where)
        except WorkloadError as exc:
            raise WorkloadError(f"{where}: {exc}") from None
    raise WorkloadError(f"{where}: {LENGTH_SYNTAX}; got {text!r}")


# ---------------------------------------------------------------------------------------------
# Length distributions (the workload page, compare; the worker counts them in tokens)
# ---------------------------------------------------------------------------------------------

# A histogram of at most this many bins reads at a glance; fewer where the values are few.
HISTOGRAM_BINS = 40
# Draws of a spec's LENGTH drawn as its histogram (seeded: the page shows the same one each time).
SPEC_DRAWS = 4000


def length_histogram(values: list[int]) -> dict | None:
    """{"edges": [bin edges, one more than counts], "counts": [...], "n", "mean", "min", "max"}
    of whole-number lengths (bins of whole numbers, numpy's "auto" choice capped at
    HISTOGRAM_BINS); None without values."""
    if not values:
        return None
    data = np.asarray(values, dtype=float)
    low, high = int(data.min()), int(data.max())
    auto = len(np.histogram_bin_edges(data, bins="auto", range=(low, high + 1))) - 1
    # a bin of a whole number of lengths: no bin straddles a length, none is empty by rounding
    width = max(1, math.ceil((high + 1 - low) / min(auto, HISTOGRAM_BINS)))
    # the last bin ends at the longest length: it may be narrower than the others
    edges = np.append(np.arange(low, high + 1, width), high + 1)
    counts, _ = np.histogram(data, bins=edges)
    return {
        "edges": [int(e) for e in edges],
        "counts": counts.tolist(),
        "n": len(values),
        "mean": float(data.mean()),
        "min": low,
        "max": high,
    }


def file_lengths(spec: dict, items: list[dict], count=len) -> dict:
    """Histograms of what a workload of a file sends, each length counted by `count` (len:
    characters; a tokenizer's count: tokens): "prompt" (a dataset's first turns, a multi-turn
    workload's every question, at most its spec's turns of each conversation), "turns" (turns
    per conversation sent), "output" (the answers' lengths; None where the file has none).
    A trace's lengths are its own tokens (`count` is not needed): its input and output lengths."""
    if spec.get("kind") == "trace":
        return {
            "prompt": length_histogram([item["input_length"] for item in items]),
            "turns": None,
            "output": length_histogram([item["output_length"] for item in items]),
        }
    cap = spec.get("turns") if spec.get("from_file") else 1
    prompts, turns, outputs = [], [], []
    for item in items:
        sent = conversation_of(item)[: cap or None]
        turns.append(len(sent))
        for question, answer in sent:
            prompts.append(count(question))
            if answer:
                outputs.append(count(answer))
    return {
        "prompt": length_histogram(prompts),
        "turns": length_histogram(turns),
        "output": length_histogram(outputs),
    }


def spec_lengths(spec: dict) -> dict:
    """Histograms (tokens) of a spec's own LENGTHs, SPEC_DRAWS seeded draws each: "prompt" (a
    random workload's input, a shared prefix's or multi-turn's question: prefix + question),
    "turns", "output"; None for what the spec does not set (a file's)."""
    rng = np.random.default_rng(0)

    def drawn(length):
        return length_histogram([draw_length(length, rng) for _ in range(SPEC_DRAWS)])

    kind = spec["kind"]
    prompt = None
    if kind == "random":
        prompt = drawn(spec["input"])
    elif kind == "shared_prefix":
        prompt = drawn(
            {"distribution": "fixed", "value": spec["prefix_len"] + spec["question_len"]}
        )
    elif kind == "multi_turn" and not spec.get("from_file"):
        prompt = drawn({"distribution": "fixed", "value": spec["question_len"]})
    turns = None
    if kind == "multi_turn" and not spec.get("from_file"):
        turns = drawn({"distribution": "fixed", "value": spec["turns"]})
    return {
        "prompt": prompt,
        "turns": turns,
        "output": drawn(spec["output"]) if spec.get("output") else None,
    }
