"""The routing a tune times under: which experts each token's top-k picks.

Every timing replays a layer call on fresh router choices from a pool of `sets` draws
(tuning.timing.LayerTimer). Uniform routing (each token's top_k distinct experts at random, as
the engines' tuners draw them) gives every expert about M·top_k/E rows; real traffic is skewed,
a few hot experts per layer, which changes how many rows each expert block sees and so which
tile wins. A routing is one of:

- `uniform`: as today.
- `zipf:S`: expert popularity ∝ 1/rank^S over the experts, in an order drawn once from the seed
  (which experts are hot is not a property of the kernel); each token draws top_k distinct
  experts in proportion to it (Gumbel top-k: sampling without replacement by weight).
- `dirichlet:A`: each set draws its own popularity from a symmetric Dirichlet of concentration A
  over the experts (small A: a few experts take most rows, and which ones changes from set to
  set, as between layers); tokens then draw as for Zipf.
- a file of top-k ids, as an engine or a model run dumps them: numpy `.npy` (an array
  [tokens, top_k], or [layers, tokens, top_k] whose layers' tokens are taken one after
  another), `.npz` (its one array, or its `topk_ids`), or JSON lines (`.jsonl`/`.json`), each
  line a list of tokens' id lists `[[e1, …, ek], …]` or one token's `[e1, …, ek]`. Each set
  takes M consecutive tokens from a place drawn from the seed, wrapping round. A file that is
  not that is refused naming what is wrong (RoutingError).

Pure numpy, imported where it is used: the web tier checks a routing's text (routing_problem)
without it. The draws are made on the host and copied to the GPU once per timer.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

KINDS = ("uniform", "zipf", "dirichlet", "file")
FILE_SUFFIXES = (".npy", ".npz", ".jsonl", ".json")
# exponents and concentrations past these bounds say nothing the bounds do not
MAX_ZIPF = 8.0
MIN_DIRICHLET, MAX_DIRICHLET = 1e-3, 1e3


class RoutingError(ValueError):
    """A routing that cannot be timed under; the message says what is wrong."""


@dataclass(frozen=True)
class Routing:
    """kind (KINDS); parameter: Zipf's exponent or Dirichlet's concentration; file and its
    sha256 for a file of top-k ids."""

    kind: str = "uniform"
    parameter: float | None = None
    file: str | None = None
    sha256: str | None = None

    @property
    def label(self) -> str:
        """ "uniform", "Zipf 1.2", "Dirichlet α=0.3", "top-k ids from trace.npy"."""
        from tuning.tune_results import routing_label

        return routing_label(self.as_dict())

    @property
    def slug(self) -> str:
        """The routing in a file name: uniform, zipf-1.2, dirichlet-0.3, ids-<first 8 of the
        file's sha256>."""
        if self.kind == "file":
            return f"ids-{self.sha256[:8]}"
        if self.kind == "uniform":
            return "uniform"
        return f"{self.kind}-{self.parameter:g}"

    def as_dict(self) -> dict:
        """JSON-ready (kept with a tune's result and log)."""
        data: dict = {"kind": self.kind}
        if self.parameter is not None:
            data["parameter"] = self.parameter
        if self.file is not None:
            data.update(file=self.file, sha256=self.sha256)
        return data

    @classmethod
    def from_dict(cls, data: dict | None) -> Routing:
        """Inverse of as_dict; None or {} (a log from before routings): uniform."""
        if not data:
            return UNIFORM
        return cls(data["kind"], data.get("parameter"), data.get("file"), data.get("sha256"))


UNIFORM = Routing()


def parse_routing(text: str) -> Routing:
    """`uniform`, `zipf:S`, `dirichlet:A` or the path of a file of top-k ids (checked when it
    is read, load_ids); RoutingError naming what is wrong."""
    text = text.strip()
    kind, colon, value = text.partition(":")
    if text == "uniform":
        return UNIFORM
    if kind in ("zipf", "dirichlet") and colon:
        try:
            parameter = float(value)
        except ValueError:
            parameter = math.nan
        if kind == "zipf" and not 0 < parameter <= MAX_ZIPF:
            raise RoutingError(f"zipf:{value}: the exponent must be a number in (0, {MAX_ZIPF:g}]")
        if kind == "dirichlet" and not MIN_DIRICHLET <= parameter <= MAX_DIRICHLET:
            raise RoutingError(
                f"dirichlet:{value}: the concentration must be a number in "
                f"[{MIN_DIRICHLET:g}, {MAX_DIRICHLET:g}]"
            )
        return Routing(kind, parameter)
    if text.endswith(FILE_SUFFIXES):
        path = Path(text)
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as exc:
            raise RoutingError(f"{text}: cannot read it: {exc.strerror}") from None
        return Routing("file", file=str(path), sha256=digest)
    raise RoutingError(
        f"{text!r}: a routing is uniform, zipf:S, dirichlet:A or a file of top-k ids "
        f"({', '.join(FILE_SUFFIXES)})"
    )


def routing_problem(text: str) -> str | None:
    """What is wrong with a routing asked for from the web (uniform, zipf:S, dirichlet:A; a
    file of ids lives on the GPU host and is given to the CLI there), or None."""
    if text.strip().endswith(FILE_SUFFIXES):
        return "a file of top-k ids is given on the GPU host: python -m tuning tune --routing FILE"
    try:
        parse_routing(text)
    except RoutingError as exc:
        return str(exc)
    return None


def load_ids(path: str | Path, E: int, top_k: int):
    """The top-k ids of a file, [tokens, top_k] int32; RoutingError naming the file and what is
    wrong with it (its shape, an id outside the E experts, a token naming an expert twice)."""
    import numpy as np

    path = Path(path)
    name = path.name
    try:
        if path.suffix == ".npy":
            ids = np.load(path, allow_pickle=False)
        elif path.suffix == ".npz":
            ids = _npz_array(path)
        else:
            ids = _json_lines(path)
    except RoutingError:
        raise
    except (OSError, ValueError) as exc:
        raise RoutingError(f"{name}: not readable as {path.suffix[1:]}: {exc}") from None
    if ids.dtype.kind not in "iu":
        raise RoutingError(f"{name}: expert ids must be integers, got {ids.dtype}")
    if ids.ndim == 3:
        ids = ids.reshape(-1, ids.shape[-1])
    if ids.ndim != 2:
        raise RoutingError(
            f"{name}: top-k ids are [tokens, top_k] or [layers, tokens, top_k], got shape "
            f"{list(ids.shape)}"
        )
    if ids.shape[0] == 0:
        raise RoutingError(f"{name}: no tokens")
    if ids.shape[1] != top_k:
        raise RoutingError(f"{name}: each token picks {ids.shape[1]} experts, the model {top_k}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= E:
        raise RoutingError(f"{name}: expert ids run {low}..{high}, the layer has 0..{E - 1}")
    ordered = np.sort(ids, axis=1)
    repeated = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
    if repeated.size:
        token = int(repeated[0])
        raise RoutingError(
            f"{name}: token {token} names an expert twice ({ids[token].tolist()}); a token's "
            "top-k are distinct experts"
        )
    return ids.astype(np.int32)


def _npz_array(path: Path):
    import numpy as np

    with np.load(path, allow_pickle=False) as archive:
        names = list(archive.files)
        if "topk_ids" in names:
            return archive["topk_ids"]
        if len(names) != 1:
            raise RoutingError(
                f"{path.name}: holds {len(names)} arrays ({', '.join(names[:5])}): name the "
                "top-k ids topk_ids, or keep one array"
            )
        return archive[names[0]]


def _json_lines(path: Path):
    import numpy as np

    tokens: list = []
    width = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            raise RoutingError(f"{path.name}: line {number} is not JSON") from None
        rows = (
            value if value and isinstance(value, list) and isinstance(value[0], list) else [value]
        )
        for row in rows:
            if not (isinstance(row, list) and row and all(type(e) is int for e in row)):
                raise RoutingError(
                    f"{path.name}: line {number}: a token is a list of expert ids, "
                    f"got {json.dumps(row)[:60]}"
                )
            if width is not None and len(row) != width:
                raise RoutingError(
                    f"{path.name}: line {number}: a token of {len(row)} experts after tokens "
                    f"of {width}"
                )
            width = len(row)
            tokens.append(row)
    return np.array(tokens, dtype=np.int64).reshape(len(tokens), width or 0)


def draw_ids(routing: Routing, sets: int, M: int, E: int, top_k: int, *, seed: int = 0):
    """`sets` draws of M tokens' top_k distinct expert ids under routing, [sets, M, top_k]
    int32 (not for uniform routing, which tuning.timing.random_routing draws on the GPU)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if routing.kind == "file":
        ids = load_ids(routing.file, E, top_k)
        starts = rng.integers(0, len(ids), size=sets)
        rows = (starts[:, None] + np.arange(M)[None, :]) % len(ids)
        return ids[rows]
    if routing.kind == "zipf":
        popularity = np.arange(1, E + 1, dtype=np.float64) ** -routing.parameter
        popularity = np.broadcast_to(popularity[rng.permutation(E)], (sets, E))
    elif routing.kind == "dirichlet":
        popularity = rng.dirichlet(np.full(E, routing.parameter), size=sets)
    else:
        raise RoutingError(f"no draws of {routing.kind} routing here")
    # Gumbel top-k: the top_k largest of log p + Gumbel noise are a draw without replacement
    # in proportion to p (a popularity of 0, a Dirichlet's underflow, comes last); one set at a
    # time, M × E keys
    ids = np.empty((sets, M, top_k), dtype=np.int32)
    with np.errstate(divide="ignore"):
        logs = np.log(popularity)
    for s in range(sets):
        keys = logs[s][None, :] + rng.gumbel(size=(M, E))
        ids[s] = np.argpartition(-keys, top_k - 1, axis=-1)[:, :top_k]
    return ids


def hottest_share(ids, E: int) -> float:
    """The share of the rows (token-expert pairs) the busiest expert gets, over all the draws
    (uniform routing: about 1/E)."""
    import numpy as np

    counts = np.bincount(ids.reshape(-1), minlength=E)
    return float(counts.max() / counts.sum())
