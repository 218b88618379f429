"""Why a sweep run or a kernel tune has no GPU samples, in one wording for the pages and the
findings. No Django here: the diagnosis rules, which touch no database, use it too."""


def no_gpu_samples_text(what, telemetry_status, telemetry_detail):
    """The sentence shown for a `what` ("run", "tune") without GPU samples: the worker's reason
    (NVML not importable, no GPU visible, …) when it sent one, else its telemetry status."""
    reason = telemetry_detail or "telemetry " + telemetry_status.replace("_", " ")
    return f"No GPU samples were recorded for this {what} ({reason})."
