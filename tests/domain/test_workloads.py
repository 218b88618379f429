"""domain.workloads: dataset files in each layout, each refusal naming the file, the line and
the reason; lengths, the engines' range-ratio conventions and specs."""

import json
from pathlib import Path

import numpy as np
import pytest

from domain import workloads
from domain.workloads import DatasetFileError, WorkloadError, parse_dataset

SHAREGPT = [
    {
        "id": "a",
        "conversations": [
            {"from": "human", "value": "Why is the sky blue?"},
            {"from": "gpt", "value": "Rayleigh scattering of sunlight by the air."},
            {"from": "human", "value": "And at sunset?"},
        ],
    },
    {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Name a prime."},
            {"from": "gpt", "value": "Seven."},
        ]
    },
]


def _jsonl(rows):
    return "\n".join(json.dumps(row) for row in rows).encode()


def test_it_reads_sharegpt_as_a_json_array_first_turns_and_their_answers():
    parsed = parse_dataset("chats.json", json.dumps(SHAREGPT, indent=2).encode())

    assert parsed["layout"] == "sharegpt"
    assert parsed["items"] == [
        {
            "prompt": "Why is the sky blue?",
            "answer": "Rayleigh scattering of sunlight by the air.",
            # every human turn is kept for a multi-turn workload, each with its answer
            "turns": [
                ["Why is the sky blue?", "Rayleigh scattering of sunlight by the air."],
                ["And at sunset?", None],
            ],
        },
        # its system turn is its system prompt, not a question
        {"prompt": "Name a prime.", "answer": "Seven.", "system": "Be brief."},
    ]


def test_it_reads_sharegpt_jsonl_and_skips_blank_lines():
    data = _jsonl(SHAREGPT) + b"\n\n"

    parsed = parse_dataset("chats.jsonl", data)

    assert [item["prompt"] for item in parsed["items"]] == ["Why is the sky blue?", "Name a prime."]


def test_it_reads_openai_messages_jsonl():
    rows = [
        {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "Hi"}]},
        {
            "messages": [
                {"role": "user", "content": "Sum 2 and 2"},
                {"role": "assistant", "content": "4"},
            ]
        },
    ]

    parsed = parse_dataset("msgs.jsonl", _jsonl(rows))

    assert parsed["layout"] == "messages"
    assert parsed["items"] == [
        {"prompt": "Hi", "answer": None, "system": "x"},
        {"prompt": "Sum 2 and 2", "answer": "4"},
    ]


def test_a_conversations_first_system_turn_is_kept_as_its_system_prompt():
    sharegpt = {
        "conversations": [
            {"from": "system", "value": "You answer in French."},
            {"from": "human", "value": "Hello"},
            {"from": "gpt", "value": "Bonjour"},
            {"from": "system", "value": "a later system turn is not the prompt's"},
            {"from": "human", "value": "Thanks"},
        ]
    }
    blank = {"messages": [{"role": "system", "content": "  "}, {"role": "user", "content": "Hi"}]}

    [item] = parse_dataset("fr.jsonl", _jsonl([sharegpt]))["items"]
    [without] = parse_dataset("blank.jsonl", _jsonl([blank]))["items"]

    assert item["system"] == "You answer in French."
    assert workloads.conversation_of(item) == [("Hello", "Bonjour"), ("Thanks", None)]
    assert "system" not in without


MT_BENCH = Path(__file__).parents[1] / "fixtures" / "workloads" / "mt_bench_questions.jsonl"


def test_it_reads_mt_bench_questions_each_a_conversation_of_its_turns():
    parsed = parse_dataset(MT_BENCH.name, MT_BENCH.read_bytes())

    assert parsed["layout"] == "mtbench"
    assert len(parsed["items"]) == 8
    first = parsed["items"][0]
    assert first["prompt"].startswith("Write a short note to a colleague")
    assert first["answer"] is None
    assert [question[:12] for question, _ in first["turns"]] == ["Write a shor", "Rewrite the "]
    assert all(len(workloads.conversation_of(item)) == 2 for item in parsed["items"])


def test_it_keeps_every_turn_of_openai_messages_with_the_answer_before_the_next_question():
    row = {
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "One"},
            {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "Two"},
            {"role": "user", "content": "Three"},
            {"role": "assistant", "content": "A3"},
        ]
    }

    [item] = parse_dataset("m.jsonl", _jsonl([row]))["items"]

    # "Two" was never answered: the answer after "Three" is not its own
    assert workloads.conversation_of(item) == [("One", "A1"), ("Two", None), ("Three", "A3")]


def test_it_refuses_an_empty_later_turn_naming_the_turn_and_the_line():
    rows = [SHAREGPT[1], {"question_id": 9, "category": "x", "turns": ["fine", "  "]}]

    with pytest.raises(DatasetFileError) as caught:
        parse_dataset("mixed.jsonl", _jsonl(rows))

    assert str(caught.value) == "mixed.jsonl, line 2: human turn 2 of turns is empty"


def test_the_answers_words_are_the_output_lengths_a_file_sets():
    items = parse_dataset("chats.json", json.dumps(SHAREGPT).encode())["items"]

    # a dataset sends first turns: both are answered
    assert workloads.answer_words({"kind": "dataset", "output": None}, items) == ([7, 1], 0)
    # a multi-turn workload of the file sends every turn: "And at sunset?" has no answer
    spec = {"kind": "multi_turn", "from_file": True, "turns": None, "output": None}
    assert workloads.answer_words(spec, items) == ([7, 1], 1)
    assert workloads.answer_words({**spec, "turns": 1}, items) == ([7, 1], 0)
    fixed = {"distribution": "fixed", "value": 9}
    assert workloads.answer_words({**spec, "output": fixed}, items) == ([], 0)


def test_it_reads_a_plain_prompts_file_one_per_line():
    parsed = parse_dataset("prompts.txt", b"first prompt\n\n  second prompt  \n")

    assert parsed == {
        "layout": "prompts",
        "items": [
            {"prompt": "first prompt", "answer": None},
            {"prompt": "second prompt", "answer": None},
        ],
    }


def _refusal(name, data, **kwargs):
    with pytest.raises(DatasetFileError) as caught:
        parse_dataset(name, data, **kwargs)
    return caught.value


def test_it_refuses_an_empty_file_by_name():
    error = _refusal("empty.jsonl", b"  \n\n")

    assert str(error) == "empty.jsonl: the file is empty"


def test_it_refuses_json_in_no_layout_naming_the_line():
    data = _jsonl([SHAREGPT[0], {"question": "what?"}])

    error = _refusal("odd.jsonl", data)

    assert error.line == 2
    assert str(error).startswith("odd.jsonl, line 2: neither a ShareGPT conversation")


def test_it_refuses_a_conversation_with_no_human_turn_by_its_line_in_an_array():
    rows = [SHAREGPT[0], {"conversations": [{"from": "gpt", "value": "unprompted"}]}]
    text = json.dumps(rows, indent=2)
    starts = [number for number, line in enumerate(text.splitlines(), 1) if line == "  {"]
    second_line = starts[1]

    error = _refusal("chats.json", text.encode())

    assert error.line == second_line
    assert "a conversation with no human turn" in str(error)
    assert str(error).startswith(f"chats.json, line {second_line}: ")


def test_it_refuses_a_prompt_over_the_context_length():
    data = b"short prompt\n" + b" ".join([b"word"] * 50) + b"\n"

    error = _refusal("prompts.txt", data, context_len=32)

    assert str(error) == (
        "prompts.txt, line 2: the prompt has at least 50 tokens (its words), over the context "
        "length of 32"
    )


def test_it_refuses_a_binary_file():
    error = _refusal("model.safetensors", b'{"a": 1}\n\x00\x01\x02binary')

    assert str(error) == "model.safetensors, line 2: a NUL byte: the file is binary, not text"


def test_it_refuses_bytes_that_are_not_utf8():
    error = _refusal("latin1.txt", "caf\u00e9\n".encode() + b"na\xefve\n")

    assert str(error) == "latin1.txt, line 2: byte 0xef is not UTF-8: the file is not text"


def test_it_refuses_a_file_over_the_size_limit_before_decoding_it():
    data = b"\xff" * (workloads.MAX_DATASET_BYTES + 1)

    error = _refusal("huge.jsonl", data)

    assert "more than a dataset may hold" in str(error)
    assert error.line is None


def test_it_refuses_broken_json_naming_its_line():
    error = _refusal("broken.json", b'[\n {"conversations": []},\n {oops}\n]')

    assert error.line == 3
    assert "not JSON" in str(error)


def test_vllm_range_ratio_is_symmetric_with_floor_and_ceil():
    assert workloads.range_ratio_length(1000, 0.25, "vllm") == {
        "distribution": "uniform",
        "low": 750,
        "high": 1250,
    }
    assert workloads.range_ratio_length(3, 0.5, "vllm") == {
        "distribution": "uniform",
        "low": 1,
        "high": 5,
    }
    with pytest.raises(WorkloadError, match=r"vLLM's is in \[0, 1\)"):
        workloads.range_ratio_length(1000, 1.0, "vllm")


def test_sglang_range_ratio_is_a_fraction_below_the_length():
    assert workloads.range_ratio_length(1000, 0.25, "sglang") == {
        "distribution": "uniform",
        "low": 250,
        "high": 1000,
    }
    assert workloads.range_ratio_length(1000, 1.0, "sglang") == {
        "distribution": "fixed",
        "value": 1000,
    }


def test_lengths_are_parsed_from_their_text():
    assert workloads.parse_length("512-1536", "input") == {
        "distribution": "uniform",
        "low": 512,
        "high": 1536,
    }
    assert workloads.parse_length("normal 1024 256 128-4096", "input")["std"] == 256
    assert workloads.parse_length("1000 ratio 0.5 sglang", "input")["low"] == 500
    with pytest.raises(WorkloadError, match="^output: "):
        workloads.parse_length("lots", "output")


def test_a_clamped_normal_stays_inside_its_bounds():
    length = workloads.length_checked(
        {"distribution": "normal", "mean": 100, "std": 1000, "low": 50, "high": 150}, "input"
    )
    rng = np.random.default_rng(0)

    drawn = [workloads.draw_length(length, rng) for _ in range(500)]

    assert min(drawn) == 50 and max(drawn) == 150


def test_uniform_draws_cover_both_ends():
    length = {"distribution": "uniform", "low": 3, "high": 5}
    rng = np.random.default_rng(1)

    assert {workloads.draw_length(length, rng) for _ in range(200)} == {3, 4, 5}


def test_a_spec_is_checked_key_by_key():
    with pytest.raises(WorkloadError, match=r"^spec.groups: a whole number from 1"):
        workloads.spec_checked(
            {"kind": "shared_prefix", "groups": 0, "prefix_len": 10, "question_len": 5}
        )
    with pytest.raises(WorkloadError, match=r"^kind: one of random"):
        workloads.spec_checked({"kind": "sharegpt"})
    with pytest.raises(WorkloadError, match=r"^input: low \(9\) is above high \(3\)"):
        workloads.spec_checked(
            {
                "kind": "random",
                "input": {"distribution": "uniform", "low": 9, "high": 3},
                "output": {"distribution": "fixed", "value": 1},
            }
        )
    assert workloads.spec_checked({"kind": "dataset"}) == {"kind": "dataset", "output": None}


def test_a_multi_turn_spec_of_a_file_needs_no_question_length_and_caps_turns_if_asked():
    checked = workloads.spec_checked({"kind": "multi_turn", "from_file": True, "question_len": 5})

    assert checked == {
        "kind": "multi_turn",
        "from_file": True,
        "turns": None,
        "think_time_s": 0.0,
        "output": None,
    }
    assert workloads.spec_label(checked) == (
        "the file's conversations, every turn, output from the file's answers, 0 s think time"
    )
    with pytest.raises(WorkloadError, match=r"^spec.turns: a whole number from 1 to 64"):
        workloads.spec_checked({"kind": "multi_turn", "from_file": True, "turns": 0})
    # without a file the questions are random words of question_len
    with pytest.raises(WorkloadError, match=r"^spec.turns"):
        workloads.spec_checked({"kind": "multi_turn", "question_len": 5})


def test_a_histogram_has_whole_number_bins_the_last_ending_at_the_longest():
    histogram = workloads.length_histogram(list(range(100, 140)))

    edges = histogram["edges"]
    assert edges[0] == 100 and edges[-1] == 140
    assert all(isinstance(e, int) for e in edges) and len(edges) - 1 <= workloads.HISTOGRAM_BINS
    # no bin empty by rounding: 40 lengths, each once
    assert sum(histogram["counts"]) == 40 and 0 not in histogram["counts"]
    assert (histogram["min"], histogram["max"], histogram["mean"]) == (100, 139, 119.5)
    assert workloads.length_histogram([]) is None


def test_a_files_lengths_are_counted_per_sent_question_and_answer():
    items = parse_dataset("chats.json", json.dumps(SHAREGPT).encode())["items"]
    spec = {"kind": "multi_turn", "from_file": True, "turns": None, "output": None}

    lengths = workloads.file_lengths(spec, items, count=lambda text: len(text.split()))

    # questions: "Why is the sky blue?" (5 words), "And at sunset?" (3), "Name a prime." (3)
    assert lengths["prompt"]["n"] == 3 and lengths["prompt"]["mean"] == 11 / 3
    assert lengths["turns"]["counts"] == [1, 1]
    # a dataset sends first turns only
    first = workloads.file_lengths({"kind": "dataset", "output": None}, items)
    assert first["prompt"]["n"] == 2 and first["turns"]["max"] == 1
