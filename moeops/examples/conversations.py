"""The example dataset workload: a few hundred conversations in the ShareGPT layout that moeops
writes itself from templates (no downloaded or copied dataset), of varied lengths: short
questions with short answers, long questions that paste a passage, answers of one line to
several paragraphs. The same file every time (a fixed seed), so its SHA-256 never changes and
loading it again stores nothing new."""

import json
import random

from moeops.runs.workloads import workload_store

EXAMPLE_WORKLOAD = "Example conversations"
EXAMPLE_FILE = "example-conversations.jsonl"
CONVERSATIONS = 320
SEED = 30

TOPICS = (
    "mixture-of-experts routing", "the KV cache", "tensor parallelism", "expert parallelism",
    "prefix caching", "speculative decoding", "chunked prefill", "FP8 weights", "NVLink",
    "PCIe peer-to-peer copies", "batch scheduling", "time to first token", "GPU power limits",
    "Triton kernel tiles", "a load balancer", "request queues", "rate limits", "token budgets",
)  # fmt: skip
QUESTIONS = (
    "What is {topic}, in two sentences?",
    "How does {topic} change the throughput of a server at high concurrency?",
    "I run a chat service. Should I care about {topic}? Explain the trade-off.",
    "Give me a checklist for debugging {topic} on an eight-GPU host.",
    "Compare {topic} with {other} for a team that serves long prompts.",
    "Summarize this note about {topic} and say what is missing:\n\n{passage}",
)
SETTINGS = (
    "We run {gpus} GPUs for about {users:,} users a day.",
    "Our prompts are about {tokens:,} tokens long and answers a tenth of that.",
    "The server caps running requests at {cap}.",
    "We moved from {gpus} to {more} GPUs last week.",
)
ANSWER_OPENINGS = (
    "In short, {topic} decides how work is spread over the hardware.",
    "{Topic} matters most when many requests are in flight at once.",
    "The trade-off with {topic} is latency against throughput.",
    "Start by measuring {topic} before changing anything.",
)
DETAILS = (
    "Each request waits behind the ones admitted before it, so the queue grows when the "
    "running-request cap is reached.",
    "A longer prompt costs more prefill, which shows in the time to the first token rather "
    "than in the time per output token.",
    "Experts that receive more tokens than others set the pace of the whole layer.",
    "Measure at several concurrencies: a single level hides where the curve flattens.",
    "Power draw far below the limit while requests queue says the GPUs wait, not work.",
    "Keep one change per run, so that a comparison names one factor.",
    "A cache hit skips the prefill of the shared part of the prompt.",
    "Copies between GPUs that cannot reach each other directly go through host memory.",
)


def _passage(rng, sentences):
    return " ".join(rng.choice(DETAILS) for _ in range(sentences))


def example_conversations():
    """The example file's bytes: CONVERSATIONS ShareGPT conversations, one JSON line each."""
    rng = random.Random(SEED)
    lines = []
    for number in range(CONVERSATIONS):
        topic, other = rng.sample(TOPICS, 2)
        template = QUESTIONS[number % len(QUESTIONS)]
        passage = _passage(rng, rng.randint(3, 24))
        setting = rng.choice(SETTINGS).format(
            gpus=rng.choice((2, 4, 8)),
            more=rng.choice((16, 32)),
            users=rng.randrange(100, 100_000, 100),
            tokens=rng.randrange(200, 20_000, 100),
            cap=rng.choice((32, 64, 128, 256)),
        )
        question = f"{setting} " + template.format(topic=topic, other=other, passage=passage)
        opening = rng.choice(ANSWER_OPENINGS).format(topic=topic, Topic=topic.capitalize())
        # answers from one line to several paragraphs
        paragraphs = [_passage(rng, rng.randint(1, 6)) for _ in range(rng.choice((0, 1, 2, 5)))]
        answer = "\n\n".join([opening, *paragraphs])
        turns = [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
        if number % 4 == 0:
            follow_up = f"And how would I see {other} in moeops' charts?"
            turns += [
                {"from": "human", "value": follow_up},
                {"from": "gpt", "value": _passage(rng, 2)},
            ]
        lines.append(json.dumps({"id": f"example-{number}", "conversations": turns}))
    return ("\n".join(lines) + "\n").encode()


def load_example_workload():
    """(Workload, created): the example dataset workload, its output lengths from its answers."""
    return workload_store(
        name=EXAMPLE_WORKLOAD,
        spec={"kind": "dataset", "output": None},
        file_name=EXAMPLE_FILE,
        data=example_conversations(),
        description="Conversations moeops writes from templates, of varied lengths",
    )
