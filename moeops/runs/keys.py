"""A level's key within its run and which kernel config a run measured: rules on plain values
that the models, importers and pages share."""

import math


def level_key(concurrency, request_rate):
    """The idempotency key of a level within a run: (concurrency, request rate)."""
    c = "?" if concurrency is None else str(concurrency)
    if request_rate is None or math.isinf(request_rate):
        r = "inf"
    else:
        r = repr(float(request_rate))
    return f"c={c},r={r}"


# The kernel-config states of a snapshot that say what the engine loaded; the others
# ("unknown", "not_applicable", or none recorded) leave it to what is on record.
KERNEL_STATES_IN_EFFECT = ("file", "engine_default")


def kernel_state(in_effect, kernel_config_id, moe_kernel) -> str:
    """ "tuned" or "default": which kernel config a run measured (compare grouping, filters).

    in_effect: the snapshot's "kernel_config" (or None); a file the engine loaded that did not
    ship with it is tuned, an engine default is not. Without either: tuned when a kernel config
    is on record for the run or an import marked it so (moe_kernel "tuned"). TUNED_KERNEL is
    the same rule as a filter."""
    in_effect = in_effect or {}
    state = in_effect.get("state")
    if state in KERNEL_STATES_IN_EFFECT:
        return "tuned" if state == "file" and in_effect.get("shipped") is False else "default"
    return "tuned" if kernel_config_id or moe_kernel == "tuned" else "default"
