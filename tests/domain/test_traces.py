"""Mooncake-format traces (domain.traces): what a line holds, and each bad file refused naming
its line and key."""

import json

import pytest

from domain.traces import keep_up_note, parse_trace, trace_facts, trace_offsets_s
from domain.workloads import DatasetFileError, WorkloadError, spec_checked, spec_label

LINES = [
    {"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]},
    {"timestamp": 0, "input_length": 600, "output_length": 26, "hash_ids": [46, 48]},
    {"timestamp": 3052.5, "input_length": 1200, "output_length": 5, "hash_ids": [46, 47, 49]},
]


def _jsonl(lines):
    return "\n".join(json.dumps(line) for line in lines).encode() + b"\n"


def test_a_jsonl_trace_keeps_each_request_in_order():
    parsed = parse_trace("t.jsonl", _jsonl(LINES), block_size=512)

    assert parsed["layout"] == "mooncake"
    assert parsed["items"] == LINES
    assert trace_offsets_s(parsed["items"], 2.0) == [0.0, 0.0, 3052.5 / 1000 / 2]


def test_a_csv_trace_reads_the_same_columns_and_its_hash_ids_as_a_list_or_separated():
    text = (
        "timestamp,input_length,output_length,hash_ids\n"
        '0,655,52,"[46, 47]"\n'
        '0,600,26,"46 48"\n'
        "3052.5,1200,5,46;47;49\n"
    )
    parsed = parse_trace("t.csv", text.encode(), block_size=512)

    assert parsed["layout"] == "mooncake_csv"
    assert parsed["items"] == LINES


def test_hash_ids_may_be_absent_and_input_length_may_pass_the_last_block():
    lines = [
        {"timestamp": 0, "input_length": 10, "output_length": 1},
        {"timestamp": 5, "input_length": 700, "output_length": 1, "hash_ids": [1]},
    ]
    items = parse_trace("t.jsonl", _jsonl(lines), block_size=512)["items"]

    assert items[0]["hash_ids"] == [] and items[1]["input_length"] == 700


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        # a truncated last line
        (_jsonl(LINES[:2]) + b'{"timestamp": 4000, "input_le', 3, "not a JSON object"),
        (_jsonl([{**LINES[0], "timestamp": -1}]), 1, "timestamp"),
        (_jsonl([LINES[2], LINES[0]]), 2, "timestamp: 0 ms is before the line above's 3052.5"),
        (_jsonl([{**LINES[0], "hash_ids": "46,47"}]), 1, "hash_ids: a list of whole numbers"),
        (_jsonl([{**LINES[0], "hash_ids": [46, 1.5]}]), 1, "hash_ids"),
        (_jsonl([{**LINES[0], "hash_ids": [46, True]}]), 1, "hash_ids"),
        (_jsonl([{**LINES[0], "hash_ids": [46, -3]}]), 1, "hash_ids"),
        # two blocks before the last hold 1,024 tokens: 1,000 does not reach the third id
        (
            _jsonl([{**LINES[0], "input_length": 1000, "hash_ids": [1, 2, 3]}]),
            1,
            "input_length: 1,000 tokens do not reach the last of its 3 hash_ids",
        ),
        (_jsonl([{**LINES[0], "input_length": 0}]), 1, "input_length"),
        (_jsonl([{**LINES[0], "output_length": "52"}]), 1, "output_length"),
        (_jsonl([{k: v for k, v in LINES[0].items() if k != "output_length"}]), 1, "missing"),
        (_jsonl([LINES[0], [1, 2]]), 2, "not a request"),
        (b'{"timestamp": 1e400, "input_length": 5, "output_length": 1}\n', 1, "timestamp"),
        (b"timestamp,input_length\n0,5\n", 1, "no output_length column"),
        (b"timestamp,input_length,output_length,hash_ids\n0,5,1,[1]\n0,5\n", 3, "truncated"),
        (b"timestamp,input_length,output_length,hash_ids\n0,5,1,1 x\n", 2, "hash_ids"),
    ],
)
def test_a_bad_trace_is_refused_naming_its_line_and_key(text, line, words):
    with pytest.raises(DatasetFileError) as refused:
        parse_trace("t.jsonl", text, block_size=512)

    assert refused.value.line == line
    assert words in refused.value.reason


@pytest.mark.parametrize("key", ["timestamp", "input_length", "output_length", "hash_ids"])
def test_a_400_digit_integer_is_refused_by_its_digits_not_printed(key):
    huge = "9" * 400
    line = {"timestamp": "0", "input_length": "600", "output_length": "5", "hash_ids": "[1, 2]"}
    line[key] = f"[1, {huge}]" if key == "hash_ids" else huge
    jsonl = ("{" + ", ".join(f'"{k}": {v}' for k, v in line.items()) + "}\n").encode()
    cells = ",".join(f'"{v}"' if k == "hash_ids" else v for k, v in line.items())
    csv_text = f"timestamp,input_length,output_length,hash_ids\n{cells}\n".encode()

    for text in (jsonl, csv_text):
        with pytest.raises(DatasetFileError) as refused:
            parse_trace("t", text, block_size=512)
        assert refused.value.reason.startswith(f"{key}:")
        assert "400-digit integer" in refused.value.reason
        assert huge not in str(refused.value)


def test_an_empty_or_binary_file_is_refused():
    for text in (b"", b"\n\n", b'{"timestamp": 0}\x00'):
        with pytest.raises(DatasetFileError):
            parse_trace("t.jsonl", text, block_size=512)


def test_a_trace_spec_defaults_to_aiperfs_block_and_speed_one():
    assert spec_checked({"kind": "trace"}) == {"kind": "trace", "block_size": 512, "speed": 1.0}
    spec = spec_checked({"kind": "trace", "block_size": 16, "speed": 2})
    assert spec == {"kind": "trace", "block_size": 16, "speed": 2.0}
    assert "2× as fast" in spec_label(spec) and "16-token blocks" in spec_label(spec)
    for bad, key in (({"speed": 0}, "speed"), ({"block_size": 0}, "block_size")):
        with pytest.raises(WorkloadError, match=key):
            spec_checked({"kind": "trace", **bad})


def test_trace_facts_count_the_block_tokens_an_earlier_request_sent():
    facts = trace_facts(LINES, 512)

    # request 2 repeats block 46 (512 tokens); request 3 repeats 46 and 47 (512 + 512)
    assert facts["reused_tokens"] == 3 * 512
    assert (facts["blocks"], facts["distinct_blocks"]) == (7, 4)
    assert facts["duration_s"] == pytest.approx(3.0525)


def test_the_keep_up_note_speaks_only_past_the_bar():
    assert keep_up_note(None, None, None) is None
    assert keep_up_note(12.0, 40.0, 0) is None
    note = keep_up_note(830.0, 1200.0, 9)
    assert "could not keep up" in note and "9 requests" in note and "830 ms" in note
