"""A failed request's reason and the engine's own words for it, and a worker's error, each as
one line for people."""

import re


def describe_failure(reason: str, detail: str | None) -> str:
    """ "HTTP 400: Token id 25531 is out of vocabulary" from ("http_400", "Token id …")."""
    head = f"HTTP {reason[5:]}" if reason.startswith("http_") else reason.replace("_", " ")
    return f"{head}: {detail}" if detail else head


# Causes a worker's error reveals (any of the texts), and the sentence that tells people.
KNOWN_CAUSES = (
    (
        (
            "_cuda_setDevice",
            "Torch not compiled with CUDA enabled",
            "No CUDA GPUs are available",
            "Found no NVIDIA driver",
        ),
        "This host cannot run CUDA: its PyTorch finds no CUDA GPU (a CPU-only PyTorch, or no "
        "NVIDIA driver), and a kernel tune needs one.",
    ),
    (
        ("CUDA out of memory", "OutOfMemoryError"),
        "The GPU ran out of memory.",
    ),
)
# A Python repr of an exception, as `f"{exc!r}"` writes it: SpreadTuneError("…").
_REPR = re.compile(r"^(?P<name>[A-Z]\w*)\((?P<quote>['\"])(?P<message>.*)(?P=quote),?\)$", re.S)
# "ConnectError: [Errno 111] Connection refused", as `f"{type(exc).__name__}: {exc}"` writes it.
_TYPED = re.compile(r"^(?P<name>[A-Z]\w*(?:Error|Exception|Exit|Timeout)): (?P<message>.*)$", re.S)
SENTENCE_MAX = 240


def explain_error(text: str, what: str = "run") -> tuple[str, str]:
    """(sentence, detail) of an error a worker stored, for people: a known cause in its own
    sentence; an exception (a repr, or "Name: message") as "The <what> failed: message";
    anything else is already written for people and is its own sentence. detail is the whole
    text where the sentence leaves some of it out, else ""."""
    text = (text or "").strip()
    if not text:
        return "", ""
    for needles, sentence in KNOWN_CAUSES:
        if any(needle in text for needle in needles):
            return sentence, text
    message = text
    if match := _REPR.match(text):
        message = match["message"].replace("\\'", "'").replace('\\"', '"')
    if match := _TYPED.match(message):
        message = match["message"]
    if message == text and len(text) <= SENTENCE_MAX and "\n" not in text:
        return text, ""
    first = message.strip().splitlines()[0] if message.strip() else "no message"
    if len(first) > SENTENCE_MAX:
        first = first[: SENTENCE_MAX - 1] + "…"
    sentence = f"The {what} failed: {first}"
    return (sentence if sentence.endswith((".", "…")) else sentence + "."), text
