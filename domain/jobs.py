"""What both tiers agree on of a job's life (a sweep run, a kernel tune, an engine action): the
statuses it goes through and those it ends in. A finished job takes no more work: the worker
stops at one, the web tier refuses writes to one."""

# Sweep runs and kernel tunes.
JOB_STATUSES = (
    ("queued", "Queued"),
    ("running", "Running"),
    ("succeeded", "Succeeded"),
    ("failed", "Failed"),
    ("cancelled", "Cancelled"),
)
FINISHED_STATUSES = ("succeeded", "failed", "cancelled")
