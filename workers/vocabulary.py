"""The model's vocabulary size: prompts are lists of token ids, and an engine answers 400 to any
id outside its vocabulary ("Token id 25531 is out of vocabulary").

`resolve(...)` takes, in this order: a size given by the caller; a tokenizer (a tokenizer.json,
or a model folder holding one or a config.json); the folder the server reports its model in
(vLLM's /v1/models "root", SGLang's /model_info "tokenizer_path") when that folder is on this
machine. Otherwise it raises VocabularyUnknown with a sentence that says what to give.
"""

import json
from pathlib import Path

from tokenizers import Tokenizer

from domain.numbers import is_integer
from tuning.moe_params import vocab_size
from workers.engine_http import EngineHTTP


class VocabularyUnknown(ValueError):
    """The vocabulary cannot be known; the message says what to give instead."""


def from_tokenizer(path) -> int:
    """Vocabulary size (added tokens included) of a tokenizer.json or a model folder.

    A folder is read from its tokenizer.json, else from its config.json's vocab_size.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            path = path / "tokenizer.json"
        elif (path / "config.json").is_file():
            return _from_config(path / "config.json")
        else:
            raise VocabularyUnknown(f"{path} holds neither a tokenizer.json nor a config.json")
    if not path.is_file():
        raise VocabularyUnknown(f"no tokenizer at {path}")
    if path.name == "config.json":
        return _from_config(path)
    try:
        return Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)
    except Exception as exc:  # the tokenizers library raises its own Exception subclass
        raise VocabularyUnknown(
            f"{path} is not a tokenizer.json the tokenizers library reads: {exc}"
        ) from None


def _from_config(path: Path) -> int:
    try:
        size = vocab_size(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise VocabularyUnknown(f"cannot read {path}: {exc}") from None
    if size is None:
        raise VocabularyUnknown(f"{path} has no vocab_size")
    return size


def server_model_folder(base_url: str, model: str, *, timeout_s: float = 10.0) -> str | None:
    """The model folder the server reports for `model` (vLLM: /v1/models root; SGLang:
    /model_info tokenizer_path), or None when it reports none."""
    with EngineHTTP(base_url, timeout_s=timeout_s) as engine:
        listed = engine.get("/v1/models")
        if listed.status is None:
            return None
        data = (listed.json_object() or {}).get("data") if listed.ok else None
        for entry in data if isinstance(data, list) else []:
            if isinstance(entry, dict) and entry.get("id") == model and entry.get("root"):
                return str(entry["root"])
        info = engine.get("/model_info")
        info = (info.json_object() if info.ok else None) or {}
        folder = info.get("tokenizer_path") or info.get("model_path")
        return str(folder) if folder else None


def resolve(*, vocab_size=None, tokenizer=None, base_url=None, model=None) -> tuple[int, str]:
    """(vocabulary size, where it came from); see the module docstring."""
    if vocab_size is not None:
        if not is_integer(vocab_size) or vocab_size < 2:
            raise VocabularyUnknown(
                f"the vocabulary size must be an integer ≥ 2, not {vocab_size!r}"
            )
        return vocab_size, "given"
    if tokenizer:
        return from_tokenizer(tokenizer), f"tokenizer {tokenizer}"
    folder = server_model_folder(base_url, model) if base_url and model else None
    if folder and Path(folder).is_absolute() and Path(folder).is_dir():
        return from_tokenizer(folder), f"{folder}, the folder the server loaded the model from"
    said = (
        f"; the server names its model {folder!r}, which is no folder on this machine"
        if folder
        else ""
    )
    raise VocabularyUnknown(
        "the model's vocabulary is unknown, so no prompt ids can be drawn that the engine "
        "accepts: give --tokenizer PATH (the model's tokenizer.json or its folder) or "
        f"--vocab-size N{said}"
    )


def model_tokenizer(*, tokenizer=None, base_url=None, model=None) -> Tokenizer | None:
    """The model's tokenizer: a tokenizer.json (or a folder holding one) given, else the one in
    the folder the server loaded the model from when that folder is on this machine; None when
    neither is at hand (prompts then go as text, counted by the server's usage)."""
    path = Path(tokenizer).expanduser() if tokenizer else None
    if path is None and base_url and model:
        folder = server_model_folder(base_url, model)
        path = Path(folder) if folder and Path(folder).is_absolute() else None
    if path is not None and path.is_dir():
        path = path / "tokenizer.json"
    if path is None or not path.is_file():
        return None
    try:
        return Tokenizer.from_file(str(path))
    except Exception:  # the tokenizers library raises its own Exception subclass
        return None
