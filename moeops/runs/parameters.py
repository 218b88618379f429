"""The one schema of a sweep run's parameters, checked on every path that writes them: the API,
sweeps started from the page or the API (run_start), imported result files, the admin and the
example data. Pages, the worker and the analysis then read these keys with these types."""

from typing import Annotated, Any, Literal

from django.core.exceptions import ValidationError
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic import ValidationError as SchemaError

from domain.capacity import MAX_BUDGET, MODES, search_problems
from domain.levels import DEFAULT_PROMPTS_PER_STREAM, MAX_ROUNDS, MAX_SEED
from domain.queues import SWEEP_SOFT_LIMIT_S
from domain.step_breakdown import DEFAULT_PROFILE_STEPS
from domain.storable import MAX_INT, storable_json
from domain.wire.fields import MAX_CONCURRENCY, Concurrency

# One sweep's numbers stay far below what a worker can hold in memory: a prompt of 2^24 tokens is
# beyond every context window (Llama 4 Scout: 10 M), a level of 2^24 requests beyond any bench.
MAX_TOKENS = 1 << 24
MAX_REQUESTS = 1 << 24
MAX_LEVELS = 1024
# What a sweep may send in all (prompt and output tokens of every request, warm-up included):
# at 1,000,000 tok/s, more than one deployment serves, a worker sends 21.6 G tokens in the 6 h a
# sweep may run; the form's full preset sends 12.7 M.
SWEEP_TOKENS_PER_S = 1_000_000
MAX_SWEEP_TOKENS = SWEEP_SOFT_LIMIT_S * SWEEP_TOKENS_PER_S

Tokens = Annotated[int, Field(strict=True, ge=1, le=MAX_TOKENS)]
Requests = Annotated[int, Field(strict=True, ge=0, le=MAX_REQUESTS)]
Positive = Annotated[float, Field(gt=0, le=1e9)]
# 1,000 steps' traces run to gigabytes on a rank of a large MoE.
MAX_PROFILE_STEPS = 1000


class ProfileParameters(BaseModel):
    """The levels a sweep profiles (each one of its levels) and the window's bound in engine
    steps: after a profiled level's rounds the worker asks the engine (vLLM's /start_profile)
    to record that many steps with the torch profiler, a pass of its own at the same load."""

    model_config = ConfigDict(extra="forbid")

    levels: list[Concurrency] = Field(min_length=1, max_length=MAX_LEVELS)
    steps: Annotated[int, Field(strict=True, ge=1, le=MAX_PROFILE_STEPS)] = DEFAULT_PROFILE_STEPS

    @model_validator(mode="before")
    @classmethod
    def _steps_stated(cls, data):
        # the stored parameters (exclude_unset) and so the worker read the default too
        if isinstance(data, dict) and "steps" not in data:
            return {**data, "steps": DEFAULT_PROFILE_STEPS}
        return data


PROFILE_SCHEMA = {
    "type": "object",
    "properties": {
        "levels": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1},
        "steps": {"type": "integer", "minimum": 1, "maximum": MAX_PROFILE_STEPS},
    },
    "required": ["levels"],
    "additionalProperties": False,
}


def _each_once(values, key, what, shown):
    """Raise ValueError naming the values given more than once in the list `key` (each shown as
    shown(value) says)."""
    repeated = sorted({value for value in values if values.count(value) > 1})
    if repeated:
        listed = ", ".join(shown(value) for value in repeated)
        raise ValueError(f"{key}: each {what} once ({listed} is given more than once)")


class RunParameters(BaseModel):
    """A run's parameters: the load of a sweep (levels, lengths in tokens, rates in req/s, SLOs
    in ms), what run_start adds from the deployment (base_url, model, gpu_indices, vocab_size),
    and for imports the file's format and SHA-256. Other keys are kept as jsonb stores them."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    levels: list[Concurrency] | None = Field(
        None, min_length=1, max_length=MAX_LEVELS, description="concurrencies, one level each"
    )
    input_len: Tokens | None = Field(None, description="prompt tokens per request")
    output_len: Tokens | None = Field(None, description="output tokens per request")
    prompts_per_level: Annotated[int, Field(strict=True, ge=1, le=MAX_REQUESTS)] | None = None
    warmup: Requests | None = Field(None, description="requests sent before each level")
    rounds: Annotated[int, Field(strict=True, ge=1, le=MAX_ROUNDS)] | None = Field(
        None, description="times each level runs in a row (warm-up included); null: once"
    )
    endpoint: Literal["completions", "chat"] | None = None
    request_rate: Positive | None = Field(None, description="req/s; null: unlimited")
    request_rates: list[Positive] | None = Field(
        None,
        min_length=1,
        max_length=MAX_LEVELS,
        description="req/s, one level per rate under each concurrency of levels (the cap)",
    )
    burstiness: Annotated[float, Field(gt=0, le=1e3)] | None = Field(
        None,
        description="gamma shape of the gaps between requests: 1 (null) Poisson; of every "
        "level of a request-rate capacity search too",
    )
    ramp_up_s: Annotated[float, Field(ge=0, le=SWEEP_SOFT_LIMIT_S)] | None = Field(
        None, description="s over which each rate level's rate rises from 0"
    )
    processes: Annotated[int, Field(strict=True, ge=1, le=1024)] | None = None
    timeout_s: Positive | None = None
    slo_ttft_ms: Positive | None = None
    slo_tpot_ms: Positive | None = None
    slo_e2el_ms: Positive | None = None
    base_url: Annotated[str, Field(max_length=200)] | None = None
    model: Annotated[str, Field(max_length=200)] | None = None
    gpu_indices: list[Annotated[int, Field(strict=True, ge=0, le=1023)]] | None = Field(
        None, max_length=1024
    )
    vocab_size: Annotated[int, Field(strict=True, ge=2, le=MAX_INT)] | None = None
    kind: Literal["sweep", "capacity"] | None = Field(
        None,
        description="capacity: an SLO capacity search (domain.capacity) from start; null or "
        "sweep: the levels given",
    )
    slo_profile: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        None,
        description="a capacity search's SLO profile, by id or name (default: the deployment's)",
    )
    slo: dict[str, Any] | None = Field(
        None, description="the profile's limits as the search ran them (set from slo_profile)"
    )
    mode: Literal[MODES] | None = Field(
        None, description="what a capacity search raises: concurrency, or request_rate (req/s)"
    )
    start: Annotated[int, Field(strict=True)] | Annotated[float, Field(strict=True)] | None = Field(
        None, description="a capacity search's first load (concurrency, or req/s)"
    )
    end: Annotated[int, Field(strict=True)] | Annotated[float, Field(strict=True)] | None = Field(
        None, description="the highest load a capacity search tries; null: no end"
    )
    budget: Annotated[int, Field(strict=True, ge=2, le=MAX_BUDGET)] | None = Field(
        None, description="the most levels a capacity search runs"
    )
    seed: Annotated[int, Field(strict=True, ge=0, le=MAX_SEED)] | None = Field(
        None,
        description="draws the prompts; run_start gives each run one of its own unless given "
        "(the same seed sends the same prompts again, which an engine's prefix cache then "
        "serves warm)",
    )
    moe_kernel: Literal["default", "tuned"] | None = Field(
        None, description="the kernel a run without a config file on record ran"
    )
    workload: (
        Annotated[str, Field(min_length=1, max_length=120)]
        | Annotated[int, Field(strict=True, ge=1, le=MAX_INT)]
        | dict
        | None
    ) = Field(
        None,
        description='the workload sent: its id, name (newest version) or "name v3"; a run '
        "stores its record and spec (id, name, version, kind, sha256, spec)",
    )
    # its schema inline: RunParameters' schema is embedded in the API's, where a $ref to a
    # $defs entry of its own would point nowhere
    profile: Annotated[ProfileParameters, WithJsonSchema(PROFILE_SCHEMA)] | None = Field(
        None,
        description='{"levels": [concurrency, …], "steps": 1–1000 (default 40)}: levels to '
        "profile inside the engine's step after their rounds (docs/metrics.md, \"Inside the "
        'step")',
    )
    format: Literal["sglang", "vllm", "moeops", "aiperf", "guidellm", "inference-perf"] | None = (
        Field(None, description="an imported file's")
    )
    file_name: Annotated[str, Field(max_length=300)] | None = None
    import_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None

    @model_validator(mode="after")
    def _checked(self):
        if self.kind == "capacity":
            mode = self.mode or "concurrency"
            problems = search_problems(mode, self.start, self.end)
            for key, sentence in problems.items():
                raise ValueError(f"{key}: {sentence}")
            for key in ("start", "end"):
                value = getattr(self, key)
                if mode == "concurrency" and value is not None and value > MAX_CONCURRENCY:
                    raise ValueError(f"{key}: at most {MAX_CONCURRENCY} concurrent requests")
        if self.levels is not None:
            _each_once(self.levels, "levels", "concurrency", str)
        if self.request_rates is not None:
            if self.request_rate is not None:
                raise ValueError(
                    "request_rates: give the rates of the levels here, or one request_rate for "
                    "every level, not both"
                )
            _each_once(self.request_rates, "request_rates", "rate", lambda rate: f"{rate:g}")
        if self.profile is not None:
            self._check_profile()
        rated = self.request_rate is not None or self.request_rates is not None
        rated = rated or (self.kind == "capacity" and self.mode == "request_rate")
        for name in ("burstiness", "ramp_up_s"):
            if getattr(self, name) is not None and not rated:
                raise ValueError(
                    f"{name}: shapes the arrivals of a request rate; give one (or search "
                    "capacity in request_rate mode)"
                )
        tokens = self.sweep_tokens()
        if tokens is not None and tokens > MAX_SWEEP_TOKENS:
            # no "key: " in front: the bound is on the product of several keys
            raise ValueError(
                f"a sweep may send at most {MAX_SWEEP_TOKENS:,} tokens, levels × rounds × (prompts "
                f"per level + warm-up) × (input + output tokens), as much as a worker sends in the "
                f"{SWEEP_SOFT_LIMIT_S // 3600} h a sweep may run even at {SWEEP_TOKENS_PER_S:,} "
                f"tok/s; this one would send {tokens:,}"
            )
        # every value, the named keys' strings and the others alike, as jsonb stores it
        storable_json(self.model_dump(exclude_unset=True))
        return self

    def _check_profile(self):
        if self.levels is None:
            raise ValueError(
                "profile.levels: a sweep profiles levels it runs; give the sweep's levels "
                "(a capacity search picks its own as it goes)"
            )
        strangers = [c for c in self.profile.levels if c not in self.levels]
        if strangers:
            raise ValueError(
                f"profile.levels: {', '.join(map(str, strangers))} "
                f"{'is' if len(strangers) == 1 else 'are'} not among the sweep's levels "
                f"({', '.join(map(str, self.levels))})"
            )

    def sweep_tokens(self) -> int | None:
        """Prompt and output tokens the sweep sends in all, warm-up and every round included;
        None without levels and lengths (an imported run's parameters)."""
        if self.levels is None or self.input_len is None or self.output_len is None:
            return None
        requests = sum(
            (self.prompts_per_level or DEFAULT_PROMPTS_PER_STREAM * concurrency)
            + (self.warmup or 0)
            for concurrency in self.levels
        ) * len(self.request_rates or [None])
        return requests * (self.rounds or 1) * (self.input_len + self.output_len)


def parameters_checked(parameters: Any) -> dict:
    """The parameters as RunParameters reads them (the keys given, nothing added); raises
    ValidationError naming the first wrong key ("parameters.levels": …)."""
    if parameters is None:
        return {}
    try:
        checked = RunParameters.model_validate(parameters)
    except SchemaError as exc:
        error = exc.errors()[0]
        loc = [str(part) for part in error["loc"]]
        message = error["msg"].removeprefix("Value error, ")
        if not loc and ": " in message:
            # the model's own checks name their key in front of the message
            key, message = message.split(": ", 1)
            loc = [key]
        if len(loc) > 1:
            message = f"{'.'.join(loc[1:])}: {message}"
        field = f"parameters.{loc[0]}" if loc else "parameters"
        raise ValidationError({field: message}) from None
    return checked.model_dump(exclude_unset=True)
