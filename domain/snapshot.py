"""A run's snapshot as both tiers read it: what the run measured, recorded when it was created
and when its engine first answered (moeops.runs.snapshots writes it; its docstring has the
whole shape). `RunSnapshot.read(run.snapshot)`: the parts the pages, the analysis and the
worker read, typed; the recorded deployment, the engine's answer and the kernel config in
effect stay the objects their writers made ({} or None when absent)."""

from typing import Annotated

from pydantic import BeforeValidator

from domain.numbers import is_number
from domain.worker_json import Fields, Number, Object, Text, WorkerJSON, is_object


class SnapshotFile(WorkerJSON):
    """What an imported result file says: its name, the model it measured where that is not the
    deployment's, and what it states (SGLang's server_info: gpu_count, …)."""

    file_name: Text = None
    other_model: Text = None
    stated: Fields = {}

    @property
    def stated_gpu_count(self) -> int | float | None:
        count = self.stated.get("gpu_count")
        return count if is_number(count) else None


class RunSnapshot(WorkerJSON):
    """source: "worker" | "import" | "manual" | "write-up"; deployment: the deployment as
    recorded; engine: what the engine said of itself (workers.engine_info.identify_engine);
    kernel_config: the config it would load (kernel_config_in_effect); engine_paths: its fast
    paths with their evidence (domain.engine_paths.EnginePaths); kernel_shape: the
    deployment's MoE shape; client: {"host", "pid"}; recipe: a managed engine's launch recipe;
    workload: {"name", "version", "kind", "sha256"}; file: an import's (SnapshotFile)."""

    source: Text = None
    recorded_at: Number = None
    moeops_version: Text = None
    deployment: Fields = {}
    engine: Fields = {}
    kernel_config: Object = None
    kernel_shape: Object = None
    client: Object = None
    engine_paths: Object = None
    recipe: Object = None
    workload: Object = None
    file: Annotated[SnapshotFile | None, BeforeValidator(lambda v: v if is_object(v) else None)] = (
        None
    )

    @property
    def other_model(self) -> str | None:
        """The model an imported file measured where it is not the deployment's, else None."""
        return self.file.other_model if self.file else None

    @property
    def stated_gpu_count(self) -> int | float | None:
        """The GPUs an imported file says its engine ran on, else None."""
        return self.file.stated_gpu_count if self.file else None
