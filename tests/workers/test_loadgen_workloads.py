"""What the load generator sends for each kind of workload: lengths drawn from their
distribution, shared prefixes per group, a dataset's prompts (as token ids with the model's
tokenizer), and multi-turn conversations against the stand-in engine."""

import asyncio
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Split, Whitespace

from domain.traces import keep_up_note
from domain.workloads import parse_dataset
from tests.fakes import shared_prefix_spec, standin_running
from workers import loadgen
from workers.loadgen import ClientConfig, LevelConfig, conversation_items, dataset_items
from workers.loadgen.prompts import conversation, request_prompt

LEVEL = LevelConfig(concurrency=4, input_len=32, output_len=8, num_prompts=40)
MT_BENCH = Path(__file__).parents[1] / "fixtures" / "workloads" / "mt_bench_questions.jsonl"


def _client(spec, endpoint="completions", items=None, url="http://unused"):
    workload = {"spec": spec} if items is None else {"spec": spec, "items": items}
    return ClientConfig(
        base_url=url, model="m", endpoint=endpoint, vocab_size=32000, workload=workload
    )


def _chat_level_on_standin(spec, level, items=None):
    """`level` of the workload `spec` (`items` its file's) sent to the chat endpoint of a
    stand-in engine: (its result, (done, total) as each request finished)."""
    progress = []
    with standin_running(max_running_requests=64, step_ms_base=1.0, step_ms_per_req=0.0) as url:
        result = asyncio.run(
            loadgen.run_level(
                _client(spec, endpoint="chat", items=items, url=url),
                level,
                on_request_done=lambda done, total: progress.append((done, total)),
            )
        )
    return result, progress


def _body(client, key):
    return json.loads(loadgen.build_payload(client, LEVEL, key))


def test_random_lengths_are_drawn_per_request_within_their_range():
    spec = {
        "kind": "random",
        "input": {"distribution": "uniform", "low": 10, "high": 20},
        "output": {"distribution": "normal", "mean": 50, "std": 30, "low": 40, "high": 60},
    }
    bodies = [_body(_client(spec), (0, i)) for i in range(40)]

    inputs = {len(b["prompt"]) for b in bodies}
    outputs = {b["max_tokens"] for b in bodies}
    assert inputs <= set(range(10, 21)) and len(inputs) > 5
    assert outputs <= set(range(40, 61)) and len(outputs) > 5
    # the same request draws the same prompt again (a shard in another process does too)
    assert _body(_client(spec), (0, 7)) == bodies[7]


def test_requests_of_a_group_share_its_prefix_and_ask_their_own_question():
    spec = shared_prefix_spec(groups=3, prefix_len=20, question_len=5, output_len=4)
    client = _client(spec)
    prompts = [_body(client, (0, i))["prompt"] for i in range(9)]

    assert all(len(p) == 25 for p in prompts)
    assert prompts[0][:20] == prompts[3][:20] == prompts[6][:20]
    assert prompts[0][:20] != prompts[1][:20]
    assert prompts[0][20:] != prompts[3][20:]
    other_level = LevelConfig(concurrency=8, input_len=32, output_len=8, num_prompts=40, index=1)
    assert (
        json.loads(loadgen.build_payload(client, other_level, (0, 3)))["prompt"][:20]
        == (prompts[0][:20])
    )


def test_a_shared_prefix_on_chat_is_the_system_message():
    spec = shared_prefix_spec(groups=2, prefix_len=6, question_len=3, output_len=4)
    messages = _body(_client(spec, endpoint="chat"), (0, 2))["messages"]

    assert [m["role"] for m in messages] == ["system", "user"]
    assert len(messages[0]["content"].split()) == 6 and len(messages[1]["content"].split()) == 3


def test_a_dataset_sends_token_ids_of_the_models_tokenizer_and_its_answers_lengths():
    vocab = {"[UNK]": 0, "hello": 1, "there": 2, "how": 3, "are": 4, "you": 5, "fine": 6}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    items = dataset_items(
        [
            {"prompt": "hello there", "answer": "fine fine fine"},
            {"prompt": "how are you", "answer": None},
        ],
        tokenizer,
    )
    client = _client({"kind": "dataset", "output": None}, items=items)

    sent = {tuple(b["prompt"]): b["max_tokens"] for b in (_body(client, (0, i)) for i in range(20))}

    assert sent == {(1, 2): 3, (3, 4, 5): LEVEL.output_len}


def test_a_dataset_without_a_tokenizer_sends_text_and_counts_answer_words():
    items = dataset_items([{"prompt": "plain text prompt", "answer": "two words"}])
    client = _client({"kind": "dataset", "output": None}, items=items)

    assert request_prompt(client, LEVEL, (0, 0)) == ("plain text prompt", 2)
    chat = _client({"kind": "dataset", "output": None}, endpoint="chat", items=items)
    assert _body(chat, (0, 0))["messages"] == [{"role": "user", "content": "plain text prompt"}]


def test_a_multi_turn_conversation_sends_its_history_every_turn():
    spec = {
        "kind": "multi_turn",
        "turns": 3,
        "question_len": 6,
        "output": {"distribution": "fixed", "value": 5},
        "think_time_s": 0.05,
    }
    level = LevelConfig(concurrency=2, input_len=6, output_len=5, num_prompts=4)
    result, progress = _chat_level_on_standin(spec, level)

    assert (result["completed"], result["failed"]) == (12, 0)
    assert progress[-1] == (12, 12)
    turns = result["ttft_by_turn"]
    assert [(t["turn"], t["completed"]) for t in turns] == [(1, 4), (2, 4), (3, 4)]
    # each turn sends the questions and the answers before it (the stand-in counts a message's
    # words and 4 template tokens): the first turn its 6-word question, each later one a new
    # question and the answer before it
    inputs = [t["mean_input_tokens"] for t in turns]
    assert inputs[0] == 6 + 4 and inputs[0] < inputs[1] < inputs[2]
    assert result["total_input_tokens"] > 12 * 6


def test_a_multi_turn_workload_of_a_file_sends_each_conversations_own_turns():
    # MT-bench's layout: two questions a line, no answers
    rows = [
        {"question_id": 1, "category": "math", "turns": ["one two three", "four five"]},
        {"question_id": 2, "category": "stem", "turns": ["six seven eight nine", "ten"]},
    ]
    parsed = parse_dataset("q.jsonl", "\n".join(json.dumps(r) for r in rows).encode())
    spec = {"kind": "multi_turn", "from_file": True, "turns": None, "output": None}
    spec["think_time_s"] = 0.0
    client = _client(spec, endpoint="chat", items=conversation_items(parsed["items"]))
    level = LevelConfig(concurrency=2, input_len=6, output_len=5, num_prompts=6)

    conversations = [conversation(client, level, (0, i)) for i in range(6)]

    questions = {tuple(q for q, _ in turns) for turns in conversations}
    assert questions == {("one two three", "four five"), ("six seven eight nine", "ten")}
    # no answers in the file: each turn takes the level's output length
    assert {out for turns in conversations for _, out in turns} == {5}

    result, progress = _chat_level_on_standin(spec, level, items=client.workload["items"])

    assert (result["completed"], result["failed"]) == (12, 0)
    assert progress[-1] == (12, 12)
    turns = result["ttft_by_turn"]
    assert [(t["turn"], t["completed"]) for t in turns] == [(1, 6), (2, 6)]
    # the second turn sends the first question, its answer (5 words) and the new question
    assert turns[1]["mean_input_tokens"] > turns[0]["mean_input_tokens"] + 5


def test_a_files_system_prompt_goes_first_on_the_chat_endpoint_and_not_on_completions():
    rows = [
        {
            "messages": [
                {"role": "system", "content": "be brief now"},
                {"role": "user", "content": "one two three"},
                {"role": "assistant", "content": "four"},
                {"role": "user", "content": "five six"},
            ]
        }
    ]
    parsed = parse_dataset("m.jsonl", "\n".join(json.dumps(r) for r in rows).encode())
    dataset = {"kind": "dataset", "output": None}
    chat = _body(_client(dataset, endpoint="chat", items=dataset_items(parsed["items"])), (0, 0))
    plain = _body(_client(dataset, items=dataset_items(parsed["items"])), (0, 0))

    assert chat["messages"] == [
        {"role": "system", "content": "be brief now"},
        {"role": "user", "content": "one two three"},
    ]
    assert plain["prompt"] == "one two three"

    spec = {"kind": "multi_turn", "from_file": True, "turns": None, "output": None}
    spec["think_time_s"] = 0.0
    level = LevelConfig(concurrency=1, input_len=6, output_len=2, num_prompts=1)
    with standin_running(max_running_requests=8, step_ms_base=1.0, step_ms_per_req=0.0) as url:
        items = conversation_items(parsed["items"])
        result = asyncio.run(
            loadgen.run_level(_client(spec, endpoint="chat", items=items, url=url), level)
        )
        bare = [{"turns": items[0]["turns"]}]
        without = asyncio.run(
            loadgen.run_level(_client(spec, endpoint="chat", items=bare, url=url), level)
        )

    # the stand-in counts each message's words and 4 template tokens: the system prompt adds
    # its 3 words and 4 to every turn, since each turn sends the conversation from its start
    first, second = result["ttft_by_turn"]
    bare_first, bare_second = without["ttft_by_turn"]
    assert first["mean_input_tokens"] == 3 + 4 + 3 + 4 == bare_first["mean_input_tokens"] + 7
    assert second["mean_input_tokens"] == bare_second["mean_input_tokens"] + 7


def test_a_file_conversations_answers_set_each_turns_output_length_in_tokens():
    items = [{"prompt": "q1", "answer": "a,b", "turns": [["q1", "a,b"], ["q2", None], ["q3", "c"]]}]
    spec = {"kind": "multi_turn", "from_file": True, "turns": 2, "output": None}
    # the pre-tokenizer splits "a,b" into 3 tokens: one word, three tokens
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()

    with_tokens = _client(spec, endpoint="chat", items=conversation_items(items, tokenizer))
    in_words = _client(spec, endpoint="chat", items=conversation_items(items))

    # at most 2 turns; the unanswered one takes the level's length (8)
    assert conversation(with_tokens, LEVEL, (0, 0)) == [("q1", 3), ("q2", 8)]
    assert conversation(in_words, LEVEL, (0, 0)) == [("q1", 1), ("q2", 8)]


def test_the_worker_counts_a_files_lengths_in_the_models_tokens_when_it_has_its_tokenizer(
    monkeypatch,
):
    from workers import sweep, vocabulary

    # one token per character: the counts are the texts' lengths
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Split("", behavior="isolated")
    items = [{"prompt": "abc", "answer": "de", "turns": [["abc", "de"], ["fghij", None]]}]
    spec = {"kind": "multi_turn", "from_file": True, "turns": None, "output": None}
    parameters = {
        "base_url": "http://unused",
        "model": "tiny-moe",
        "workload": {"id": 1, "name": "w", "spec": spec},
        "workload_items": items,
    }
    monkeypatch.setattr(vocabulary, "model_tokenizer", lambda **_: tokenizer)

    workload = sweep.sweep_workload(parameters)

    counted = workload["token_lengths"]
    assert counted["model"] == "tiny-moe"
    assert (counted["prompt"]["min"], counted["prompt"]["max"]) == (3, 5)
    assert counted["output"]["n"] == 1 and counted["turns"]["counts"] == [1]
    config = sweep.sweep_config({**parameters, "endpoint": "chat", "levels": [1], "input_len": 4,
                                 "output_len": 4})  # fmt: skip
    assert sweep.with_workload_tokens({"completed": 1}, config)["workload_tokens"] == counted
    # without the tokenizer nothing is counted: the page then shows characters
    monkeypatch.setattr(vocabulary, "model_tokenizer", lambda **_: None)
    assert "token_lengths" not in sweep.sweep_workload(parameters)


def test_the_cli_sends_a_multi_turn_spec_with_dataset_as_the_files_conversations(tmp_path):
    from workers.loadgen import cli

    spec = tmp_path / "mt.json"
    spec.write_text(json.dumps({"kind": "multi_turn", "think_time_s": 0}))
    args = cli._parse_args(
        ["--base-url", "http://unused", "--model", "m", "--concurrency", "2"]
        + ["--input-len", "8", "--output-len", "8", "--vocab-size", "32000"]
        + ["--workload", str(spec), "--dataset", str(MT_BENCH)]
    )

    workload = cli._workload(args)

    assert workload["spec"]["from_file"] is True
    assert [len(item["turns"]) for item in workload["items"]] == [2] * 8


# ---------------------------------------------------------------------------------------------
# Traces (issue 43, item 4)
# ---------------------------------------------------------------------------------------------

TRACE = [
    {"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [7, 8, 9]},
    {"timestamp": 100, "input_length": 36, "output_length": 4, "hash_ids": [7, 8, 5]},
    {"timestamp": 250, "input_length": 20, "output_length": 2, "hash_ids": [7, 8]},
    {"timestamp": 250, "input_length": 30, "output_length": 2, "hash_ids": [3]},
]


def _trace_client(block_size=16, speed=1.0, endpoint="completions", url="http://unused"):
    spec = {"kind": "trace", "block_size": block_size, "speed": speed}
    return _client(spec, endpoint=endpoint, items=TRACE, url=url)


def test_a_traces_requests_share_the_tokens_of_the_blocks_they_name():
    client = _trace_client()
    bodies = [_body(client, (0, i)) for i in range(4)]
    prompts = [b["prompt"] for b in bodies]

    # each request its own length and output, as the trace gives them
    assert [len(p) for p in prompts] == [40, 36, 20, 30]
    assert [b["max_tokens"] for b in bodies] == [3, 4, 2, 2]
    # blocks 7 and 8 (16 tokens each) are the same tokens in the three requests that name them
    assert prompts[0][:32] == prompts[1][:32]
    # request 2's last block, 8's, holds 4 of its tokens: the first 4 of the block
    assert prompts[2] == prompts[0][:20]
    # the last block is partial: request 0's block 9 holds 8 tokens, request 1's block 5 four
    assert prompts[0][32:] != prompts[1][32:36]
    # block 7 and block 8 differ, and block 3 is none of them
    assert prompts[0][:16] != prompts[0][16:32]
    assert prompts[3][:16] not in (prompts[0][:16], prompts[0][16:32])
    # request 3's 30 tokens: block 3's 16, then 14 of its own
    assert prompts[3][:16] != prompts[3][16:32]


def test_a_trace_block_is_the_same_in_another_process_and_differs_in_another_level_or_warmup():
    client = _trace_client()
    first = _body(client, (0, 1))["prompt"]
    other_level = LevelConfig(concurrency=8, input_len=32, output_len=8, num_prompts=4, index=1)

    assert _body(_trace_client(), (0, 1))["prompt"] == first
    assert (
        json.loads(loadgen.build_payload(client, other_level, (0, 1)))["prompt"][:16]
        != (first[:16])
    )
    # a warm-up request (key (1, j)) does not warm the measured requests' blocks
    assert _body(client, (1, 1))["prompt"][:16] != first[:16]


def test_a_traces_chat_prompt_shares_its_blocks_words():
    client = _trace_client(endpoint="chat")
    texts = [_body(client, (0, i))["messages"][0]["content"].split() for i in range(3)]

    assert [len(t) for t in texts] == [40, 36, 20]
    assert texts[0][:32] == texts[1][:32] and texts[2] == texts[0][:20]


def test_a_trace_level_sends_each_request_at_its_scaled_time_and_reports_the_lateness():
    with standin_running(max_running_requests=64, step_ms_base=1.0, step_ms_per_req=0.0) as url:
        sweep = loadgen.SweepConfig(
            client=_trace_client(speed=2.0, url=url), concurrencies=(8,), input_len=1, output_len=1
        )
        (level,) = sweep.levels()
        result = asyncio.run(loadgen.run_level(sweep.client, level))

    # the level is the trace: its 4 requests, not the sweep's prompts per stream
    assert level.num_prompts == 4 and (result["completed"], result["failed"]) == (4, 0)
    starts = result["requests"]["start_time"]
    # 2× as fast: 0, 50, 125, 125 ms after the first request
    assert starts == pytest.approx([0.0, 0.05, 0.125, 0.125], abs=0.02)
    assert 0 <= result["p99_lateness_ms"] <= result["max_lateness_ms"] < 20
    assert result["late_requests"] == 0
    # each request's own length; the two due at 125 ms may finish in either order
    assert sorted(result["requests"]["input_len"]) == [20, 30, 36, 40]
    # the worker pushes it as JSON: plain numbers, no numpy scalars
    json.dumps({k: v for k, v in result.items() if "lateness" in k or k == "late_requests"})


def test_a_trace_the_client_cannot_keep_up_with_says_so():
    # one stream, and each request's 40 output tokens take ~0.2 s: the next ones wait for it
    items = [
        {"timestamp": 10 * i, "input_length": 16, "output_length": 40, "hash_ids": [1]}
        for i in range(4)
    ]
    level = LevelConfig(concurrency=1, input_len=1, output_len=1, num_prompts=4)
    with standin_running(max_running_requests=64, step_ms_base=5.0, step_ms_per_req=0.0) as url:
        client = _client({"kind": "trace", "block_size": 16, "speed": 1.0}, items=items, url=url)
        result = asyncio.run(loadgen.run_level(client, level))

    assert result["completed"] == 4
    assert result["p99_lateness_ms"] > 100 and result["late_requests"] >= 2
    note = keep_up_note(
        result["p99_lateness_ms"], result["max_lateness_ms"], result["late_requests"]
    )
    assert "could not keep up" in note


def test_the_cli_replays_a_trace_spec_with_dataset_as_the_trace(tmp_path):
    from workers.loadgen import cli

    spec = tmp_path / "trace.json"
    spec.write_text(json.dumps({"kind": "trace", "block_size": 128}))
    trace = Path(__file__).parents[1] / "fixtures" / "workloads" / "mooncake_trace.jsonl"
    args = cli._parse_args(
        ["--base-url", "http://unused", "--model", "m", "--concurrency", "2"]
        + ["--input-len", "8", "--output-len", "8", "--vocab-size", "32000"]
        + ["--workload", str(spec), "--dataset", str(trace)]
    )

    workload = cli._workload(args)

    assert workload["spec"] == {"kind": "trace", "block_size": 128, "speed": 1.0}
    assert [item["timestamp"] for item in workload["items"]] == [250 * i for i in range(12)]

    args.capacity = True
    with pytest.raises(ValueError, match="a trace sends at its own timestamps"):
        cli._workload(args)
