"""What each request sends: its prompt and output length, drawn from the run's workload
(domain.workloads) or, without one, random token ids of the level's fixed lengths.

Every draw is seeded by (client seed, level index, request key), so a request's prompt is the
same however the level is split over processes; a shared prefix is seeded by its group alone,
so that every request of the group (at every level) sends the same one.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from domain.workloads import conversation_of, draw_length
from workers.loadgen.config import CHAT_WORDS, ClientConfig, LevelConfig

# Seeds the shared prefixes apart from the requests' own draws.
PREFIX_STREAM = 0x5EED
# Seeds a trace's blocks apart from both.
TRACE_STREAM = 0x7ACE


def token_id_range(vocab_size: int) -> tuple[int, int]:
    """Half-open range of token ids to draw prompts from.

    Skips the lowest ids (byte and control tokens) and the top 20% where tokenizers keep their
    special and added tokens (Llama 3 from 128000 of 128256, DeepSeek-V3 from 128000 of 129280,
    Qwen from 151643 of 151936, Kimi K2 from 163584 of 163840).
    """
    low = min(1000, vocab_size // 10)
    return low, max(low + 1, int(vocab_size * 0.8))


def _random_ids(client_cfg: ClientConfig, rng: np.random.Generator, n: int) -> list[int]:
    if client_cfg.vocab_size is None:
        raise ValueError("prompts of token ids need the model's vocabulary size")
    low, high = token_id_range(client_cfg.vocab_size)
    return rng.integers(low, high, size=n).tolist()


def _random_words(rng: np.random.Generator, n: int) -> str:
    return " ".join(CHAT_WORDS[w] for w in rng.choice(len(CHAT_WORDS), size=n))


def _random_prompt(client_cfg: ClientConfig, rng: np.random.Generator, n: int):
    """n random token ids (completions) or n common words (chat, ≈ n tokens)."""
    if client_cfg.endpoint == "chat":
        return _random_words(rng, n)
    return _random_ids(client_cfg, rng, n)


def _output_len(spec: dict | None, level: LevelConfig, rng: np.random.Generator) -> int:
    if spec and spec.get("output"):
        return draw_length(spec["output"], rng)
    return level.output_len


def request_prompt(
    client_cfg: ClientConfig, level: LevelConfig, key: tuple[int, ...]
) -> tuple[list[dict] | str | list[int], int]:
    """(prompt, output tokens) of one single-turn request: a list of chat messages (chat
    endpoint), or token ids or a text (completions)."""
    rng = np.random.default_rng((client_cfg.seed, level.index, *key))
    workload = client_cfg.workload or {}
    spec = workload.get("spec")
    kind = spec["kind"] if spec else "random"
    chat = client_cfg.endpoint == "chat"
    if kind == "dataset":
        items = workload["items"]
        item = items[int(rng.integers(len(items)))]
        prompt = item["prompt"] if chat or "prompt_ids" not in item else item["prompt_ids"]
        if spec.get("output"):
            output = draw_length(spec["output"], rng)
        else:
            output = item.get("output_len") or level.output_len
        if chat:
            return _with_system(item, [{"role": "user", "content": prompt}]), output
        return prompt, output
    if kind == "trace":
        return trace_prompt(client_cfg, level, key)
    if kind == "shared_prefix":
        group = key[-1] % spec["groups"]
        prefix_rng = np.random.default_rng((client_cfg.seed, PREFIX_STREAM, group))
        prefix = _random_prompt(client_cfg, prefix_rng, spec["prefix_len"])
        question = _random_prompt(client_cfg, rng, spec["question_len"])
        output = _output_len(spec, level, rng)
        if chat:
            messages = [
                {"role": "system", "content": prefix},
                {"role": "user", "content": question},
            ]
            return messages, output
        return prefix + question, output
    input_len = draw_length(spec["input"], rng) if kind == "random" and spec else level.input_len
    output = _output_len(spec, level, rng)
    prompt = _random_prompt(client_cfg, rng, input_len)
    return ([{"role": "user", "content": prompt}] if chat else prompt), output


@lru_cache(maxsize=16384)
def _trace_block(
    seed: int, level_index: int, phase: int, hash_id: int, size: int, vocab: int | None
) -> np.ndarray:
    """The `size` tokens of one hash id's block: token ids drawn from the model's vocabulary,
    or (vocab None, chat) indices of CHAT_WORDS. Seeded by the hash id, the client's seed, the
    level and whether the request is a warm-up's (phase), not by the request: every request
    naming the id gets the same tokens, and another level (round, warm-up) starts cold."""
    rng = np.random.default_rng((seed, TRACE_STREAM, level_index, phase, hash_id))
    if vocab is None:
        return rng.integers(0, len(CHAT_WORDS), size=size)
    low, high = token_id_range(vocab)
    return rng.integers(low, high, size=size)


def trace_prompt(
    client_cfg: ClientConfig, level: LevelConfig, key: tuple[int, ...]
) -> tuple[list[dict] | list[int], int]:
    """(prompt, output tokens) of the trace's request key[-1]: one block per hash id, each
    block_size tokens but the last, which holds the rest of input_length (its block's first
    tokens, then tokens of the request's own where input_length goes past it). Two requests
    naming a hash id send its block's tokens alike, where it stands in both, so an engine's
    prefix cache meets the trace's reuse. Completions: token ids, input_length exactly; chat:
    one word a token of the block (CHAT_WORDS, ≈ input_length tokens)."""
    workload = client_cfg.workload
    spec, items = workload["spec"], workload["items"]
    item = items[key[-1] % len(items)]
    chat = client_cfg.endpoint == "chat"
    if not chat and client_cfg.vocab_size is None:
        raise ValueError("prompts of token ids need the model's vocabulary size")
    vocab = None if chat else client_cfg.vocab_size
    size, remaining = spec["block_size"], item["input_length"]
    pieces = []
    for hash_id in item["hash_ids"]:
        if remaining <= 0:
            break
        block = _trace_block(client_cfg.seed, level.index, key[0], hash_id, size, vocab)
        pieces.append(block[: min(size, remaining)])
        remaining -= len(pieces[-1])
    if remaining > 0:
        # past the blocks: this request's own tokens, shared with none
        rng = np.random.default_rng((client_cfg.seed, level.index, *key))
        if chat:
            pieces.append(rng.integers(0, len(CHAT_WORDS), size=remaining))
        else:
            low, high = token_id_range(vocab)
            pieces.append(rng.integers(low, high, size=remaining))
    tokens = np.concatenate(pieces).tolist()
    if chat:
        return [{"role": "user", "content": " ".join(CHAT_WORDS[w] for w in tokens)}], item[
            "output_length"
        ]
    return tokens, item["output_length"]


def is_trace(client_cfg: ClientConfig) -> bool:
    """Whether the workload is a trace: each key one of its requests, sent at its time."""
    spec = (client_cfg.workload or {}).get("spec") or {}
    return spec.get("kind") == "trace"


def _with_system(item: dict, messages: list[dict]) -> list[dict]:
    """A file's chat messages after its system prompt, where it has one."""
    if item.get("system"):
        return [{"role": "system", "content": item["system"]}, *messages]
    return messages


def _file_conversation(
    client_cfg: ClientConfig, level: LevelConfig, key: tuple[int, ...]
) -> tuple[dict, np.random.Generator]:
    """The file's conversation that key sends, and the generator that drew it (its turns'
    output lengths are drawn from it next)."""
    rng = np.random.default_rng((client_cfg.seed, level.index, *key))
    items = client_cfg.workload["items"]
    return items[int(rng.integers(len(items)))], rng


def conversation_start(
    client_cfg: ClientConfig, level: LevelConfig, key: tuple[int, ...]
) -> list[dict]:
    """The messages a multi-turn conversation starts with before its first question: the
    file's system prompt, where its conversation has one; none otherwise."""
    if not client_cfg.workload["spec"].get("from_file"):
        return []
    item, _ = _file_conversation(client_cfg, level, key)
    return _with_system(item, [])


def conversation(
    client_cfg: ClientConfig, level: LevelConfig, key: tuple[int, ...]
) -> list[tuple[str, int]]:
    """[(question text, output tokens), …]: the turns of one multi-turn conversation, random
    words of the spec's question length, or one of the file's conversations (at most the spec's
    turns of it), each turn's output the spec's length, else its answer's, else the level's."""
    spec = client_cfg.workload["spec"]
    if spec.get("from_file"):
        item, rng = _file_conversation(client_cfg, level, key)
        turns = item["turns"][: spec.get("turns") or None]
        return [
            (
                turn["question"],
                draw_length(spec["output"], rng)
                if spec.get("output")
                else turn["output_len"] or level.output_len,
            )
            for turn in turns
        ]
    out = []
    for turn in range(1, spec["turns"] + 1):
        rng = np.random.default_rng((client_cfg.seed, level.index, *key, turn))
        out.append((_random_words(rng, spec["question_len"]), _output_len(spec, level, rng)))
    return out


def is_multi_turn(client_cfg: ClientConfig) -> bool:
    """Whether each key is a conversation of turns (a multi-turn workload), not one request."""
    spec = (client_cfg.workload or {}).get("spec") or {}
    return spec.get("kind") == "multi_turn"


def requests_of(client_cfg: ClientConfig, level: LevelConfig, keys: list[tuple[int, ...]]) -> int:
    """The requests these keys send: one each, or one per turn of each conversation."""
    if not is_multi_turn(client_cfg):
        return len(keys)
    return sum(len(conversation(client_cfg, level, key)) for key in keys)


def dataset_items(items: list[dict], tokenizer=None) -> list[dict]:
    """A dataset's prompts as the load generator sends them: {"prompt", "output_len"} and,
    with the model's tokenizer (a tokenizers.Tokenizer), "prompt_ids" (its special tokens
    included, as the server would add them to the text). output_len: the answer's tokens
    (without a tokenizer its words, at most as many as its tokens), None without an answer.
    "system": the file's system prompt, sent before the prompt on the chat endpoint (the
    completions endpoint has no roles: it sends the prompt alone)."""
    out = []
    for item in items:
        answer = item.get("answer")
        prepared = {"prompt": item["prompt"], "output_len": None}
        if item.get("system"):
            prepared["system"] = item["system"]
        if tokenizer is not None:
            prepared["prompt_ids"] = tokenizer.encode(item["prompt"]).ids
            if answer:
                prepared["output_len"] = len(tokenizer.encode(answer, add_special_tokens=False))
        elif answer:
            prepared["output_len"] = len(answer.split())
        if prepared["output_len"] == 0:
            prepared["output_len"] = None
        out.append(prepared)
    return out


def conversation_items(items: list[dict], tokenizer=None) -> list[dict]:
    """A file's conversations as a multi-turn workload sends them: {"turns": [{"question",
    "output_len"}]}, each turn's output_len its answer's tokens with the model's tokenizer (a
    tokenizers.Tokenizer), else its words, None without an answer; "system", the file's system
    prompt where it has one. Questions go as text: each turn is chat messages."""
    out = []
    for item in items:
        turns = []
        for question, answer in conversation_of(item):
            output_len = None
            if answer and tokenizer is not None:
                output_len = len(tokenizer.encode(answer, add_special_tokens=False).ids)
            elif answer:
                output_len = len(answer.split())
            turns.append({"question": question, "output_len": output_len or None})
        out.append({"turns": turns, **({"system": item["system"]} if item.get("system") else {})})
    return out
