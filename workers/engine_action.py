"""One engine action on the host's worker (`workers.engine_action`): put the recipe's kernel
configs where the engine reads them, restart the deployment's engine with the recipe, check that
the engine reports the change, and report every step to the API.

When the new recipe does not come up, or comes up without the change, the previous recipe runs
again with its own kernel configs and the action ends failed with the engine's last log lines:
nothing is left half-applied. The action's payload is what moeops.engines.services sends:
{"host", "engine", "model", "kind", "recipe", "previous", "changes", "kernel_shape", "resweep"},
recipes as workers.engine_supervisor.Recipe takes them plus their "kernel_files"
([{"file_name", "text"}]).
"""

import contextlib
import functools
import hashlib
import logging
import time
from pathlib import Path

from domain import launch
from tuning.config_files import ConfigFileError, config_file_relpath, configs_root
from workers import job
from workers.client import ApiError, BadPush, Conflict
from workers.engine_info import identify_engine, kernel_config_in_effect, locate_engine_package
from workers.engine_supervisor import EngineSupervisor, Recipe, SupervisorError

log = logging.getLogger(__name__)

FINISHED = ("succeeded", "failed")
# How often the wait for /health is reported (s): an engine may take minutes to load.
WAIT_REPORT_S = 5.0
# How often the action's heartbeat is sent (s), well within domain.progress.HEARTBEAT_STALE_S.
HEARTBEAT_S = 2.0
LOG_LINES = 40


class ActionFailed(RuntimeError):
    """The action ended failed (already reported); a chain's later steps must not run."""


class ActionTakenOver(Exception):
    """Another delivery took the action over (this one was thought gone): this one stops where
    it is, and reverts nothing: the engine is the other delivery's now."""


class _Steps:
    """The action's steps as the page shows them, each push with the delivery's heartbeat
    (workers.job). A step's progress is advisory (one attempt, never spooled: the next push
    says more); a status move is spooled, so that it arrives. A push refused because another
    delivery took the action over stops the action at its next step (ActionTakenOver)."""

    def __init__(self, action, supervisor, deployment):
        self.job = action
        self.client = action.client
        self.action = action.ref
        self.supervisor = supervisor
        self.deployment = deployment
        self.steps: list[dict] = []
        self.taken_over = False
        self.heartbeat = None
        self._last_wait = 0.0
        self._kept_tail = None

    def _tail(self):
        # the log of the action's own start: none before it (the log is the old engine's)
        if not any(step["name"] == "start" for step in self.steps):
            return ""
        return self.supervisor.log_tail(self.deployment, LOG_LINES)

    def keep_log(self):
        """Show the log of the recipe that failed from now on, not that of the revert's start."""
        self._kept_tail = self._tail()

    def _body(self, **fields):
        tail = self._kept_tail if self._kept_tail is not None else self._tail()
        body = {"steps": self.steps, **({"log_tail": tail} if tail else {}), **fields}
        return {**body, "progress": self.job.stamp()}

    def _advise(self):
        try:
            self.client.report_action(self.action, advisory=True, **self._body())
        except Conflict as exc:
            log.warning("engine action %s: taken over by another delivery: %s", self.action, exc)
            self.taken_over = True
        except (ApiError, BadPush) as exc:
            log.info("engine action %s: progress not sent: %s", self.action, exc)

    def begin(self, name, detail=""):
        if self.taken_over or (self.heartbeat is not None and self.heartbeat.taken_over):
            raise ActionTakenOver
        self.steps.append({"name": name, "status": "running", "detail": detail, "at": time.time()})
        self._advise()

    def end(self, detail="", status="done"):
        self.steps[-1].update(status=status, detail=detail or self.steps[-1]["detail"])
        self.steps[-1]["ended_at"] = time.time()
        self._advise()

    def waiting(self, elapsed):
        if time.monotonic() - self._last_wait >= WAIT_REPORT_S:
            self._last_wait = time.monotonic()
            self.steps[-1]["detail"] = f"waiting for /health: {elapsed:.0f} s"
            self._advise()

    def finish(self, status, **fields):
        """Move the action to status with its steps (spooled while the web tier is away)."""
        body = self._body(**fields)
        return self.client.report_action(self.action, status=status, **body)


def _recipe(data, folder):
    """The Recipe to start: its config folder pointed at by the engine's variable only when it
    holds kernel configs (SGLang's variable replaces the engine's own folder)."""
    fields = {k: v for k, v in data.items() if k != "kernel_files"}
    if data.get("kernel_files"):
        fields["config_folder"] = str(folder)
    else:
        fields["config_env"] = fields["config_folder"] = None
    return Recipe.from_dict(fields)


def config_folder(supervisor, data) -> Path:
    """Where the recipe's kernel configs go: its config_folder, else the deployment's own
    folder in the worker's cache."""
    given = data.get("config_folder")
    return Path(given) if given else supervisor.root / str(data["deployment"]) / "kernel-configs"


def _paths(engine, folder, files, package):
    """{file name: where the engine reads it} under folder (SGLang: configs/triton_X_Y_Z/, for
    the Triton of package: locate_engine_package's answer)."""
    if not files:
        return {}
    triton = None
    if engine == "sglang":
        triton = package().get("triton")
        if not triton:
            raise ActionFailed("SGLang's Triton version is unknown here (set MOEOPS_SGLANG_PYTHON)")
    root = configs_root(engine, folder)
    try:
        return {
            f["file_name"]: root / config_file_relpath(f["file_name"], engine, triton)
            for f in files
        }
    except ConfigFileError as exc:
        raise ActionFailed(str(exc)) from None


def _install(engine, folder, files, remove, package):
    """Write files (atomically) and remove the files named in remove that files lacks."""
    paths = _paths(engine, folder, files, package)
    for entry in files:
        path = paths[entry["file_name"]]
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(entry["text"])
        partial.replace(path)
    for name, path in _paths(engine, folder, remove, package).items():
        if name not in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return paths


def _check_changes(identity, changes):
    """[(sentence, ok)] per changed flag, as the engine reports it."""
    out = []
    for flag, value in (changes or {}).items():
        got = launch.reported(identity.get("args"), flag)
        name = launch.arg_name(flag)
        if got is None:
            note = "; ".join(identity.get("notes") or []) or "it reports no such argument"
            out.append((f"{name}: not reported by the engine ({note})", True))
        elif value is None or launch.same_value(got, value):
            out.append((f"the engine reports {name} = {got}", True))
        else:
            out.append((f"the engine reports {name} = {got}, not {value}", False))
    return out


def _check_recipe(identity, argv, changes):
    """[(sentence, False)] per other numeric flag or switch of the recipe that the engine
    reports with another value: what answers is not the engine the recipe started."""
    out = []
    for flag, value in launch.flags(argv).items():
        if not flag.startswith("--") or flag in (changes or {}):
            continue
        got = launch.reported(identity.get("args"), flag)
        numeric = isinstance(got, bool | int | float) and _number_or_switch(value)
        if numeric and not launch.same_value(got, value):
            name = launch.arg_name(flag)
            out.append((f"the engine reports {name} = {got}, not {value} as the recipe", False))
    return out


def _number_or_switch(value):
    try:
        float(value or "0")
    except ValueError:
        return False
    return True


def _check_config(engine, shape, identity, paths, files, recipe, package):
    """(sentence, ok): whether the engine loads the file written for its shape, looking where
    the engine reports it looks (vLLM's environment in /server_info); an engine that does not
    report it is taken to run with the recipe's environment, and the sentence says so."""
    if not files:
        return "no kernel config written: the engine runs its own", True
    env = dict(identity.get("env") or {})
    assumed = ""
    if recipe.config_env and recipe.config_env not in env:
        env[recipe.config_env] = recipe.config_folder
        assumed = f" ({recipe.config_env} as the recipe sets it: the engine does not report it)"
    found = kernel_config_in_effect(engine=engine, shape=shape, reported_env=env, package=package())
    texts = {f["file_name"]: f["text"] for f in files}
    wanted = texts.get(found.get("file_name"))
    if found.get("state") != "file" or wanted is None:
        return f"the engine does not load the file written: {found.get('reason') or found}", False
    digest = hashlib.sha256(wanted.encode()).hexdigest()
    if found.get("path") != str(paths[found["file_name"]]) or found.get("sha256") != digest:
        return f"the engine would load {found.get('path')}, not the file written", False
    return f"the engine loads {found['path']} from {found['folder']}{assumed}", True


def run_action(action_uuid, payload, *, client, host_name, supervisor=None):
    """Carry out one engine action (see the module docstring); returns "succeeded" or
    "sweeping" (a re-sweep follows), or workers.job.BUSY when another delivery is at it. Raises
    ActionFailed once the failure is reported, or when another delivery took the action over."""
    supervisor = supervisor or EngineSupervisor()
    new_data, old_data = payload["recipe"], payload.get("previous")
    deployment = new_data["deployment"]
    action = job.Job(client, job.ACTION, action_uuid)
    steps = _Steps(action, supervisor, deployment)
    if payload.get("host") != host_name:
        error = f"a recipe of host {payload.get('host')} reached the worker of {host_name}"
        steps.finish("failed", error=error)
        raise ActionFailed(error)
    try:
        claimed = action.claim()
    except ApiError as exc:
        # refused (another host's token, gone): the engine is not touched
        raise ActionFailed(f"the action cannot run: {exc}") from None
    if claimed == job.BUSY:
        return job.BUSY
    if isinstance(claimed, str):
        raise ActionFailed(f"the action is already {claimed}")
    # beats while a step says nothing (an engine stopping, a file written), so that a delivery
    # of the task again finds this one alive and stands down
    steps.heartbeat = job.Heartbeat(action, dict, HEARTBEAT_S, log=log)
    steps.heartbeat.start()
    try:
        return _carry_out(steps, payload, supervisor, new_data, old_data)
    except ActionTakenOver:
        raise ActionFailed("another delivery of the action took it over") from None
    finally:
        steps.heartbeat.stop()


def _carry_out(steps, payload, supervisor, new_data, old_data):
    """The action's steps once it is this delivery's: stop, write the kernel configs, start,
    check; on a failure the previous recipe back and the action failed (ActionFailed)."""
    deployment = steps.deployment
    engine = payload.get("engine", "")
    # where the engine is installed (its Python is asked once per action)
    package = functools.cache(lambda: locate_engine_package(engine))
    new_folder = config_folder(supervisor, new_data)
    new_files = new_data.get("kernel_files") or []
    new = _recipe(new_data, new_folder)
    steps.begin("stop", "stopping the engine")
    stopped = supervisor.stop(deployment)
    steps.end("stopped" if stopped else "no engine of this deployment was running")
    try:
        steps.begin("kernel configs", f"{len(new_files)} file(s) for {new_folder}")
        old_files = (old_data or {}).get("kernel_files") or []
        written = _install(engine, new_folder, new_files, remove=old_files, package=package)
        steps.end(", ".join(map(str, written.values())) or "none: the engine runs its own")
        steps.begin("start", f"starting recipe v{new.version}")
        state = supervisor.start(new, on_wait=steps.waiting)
        # "healthy" only once the engine said it runs the recipe: its process answering on its
        # own port is not yet that
        ready_s = state.get("ready_after_s", 0)
        steps.end(f"its own process answers on its port after {ready_s:.0f} s (pid {state['pid']})")
        steps.begin("check", "asking the engine what it runs with")
        identity = identify_engine(new.base_url)
        checks = _check_changes(identity, payload.get("changes"))
        checks += _check_recipe(identity, new.argv, payload.get("changes"))
        shape = payload.get("kernel_shape")
        checks.append(_check_config(engine, shape, identity, written, new_files, new, package))
        detail = "; ".join(sentence for sentence, _ in checks)
        if not all(ok for _, ok in checks):
            raise ActionFailed(f"the engine came up without the change: {detail}")
        steps.end(f"healthy: {detail}")
    except ActionTakenOver:
        raise
    except Exception as exc:
        # whatever stopped the change (the engine, a file, the time limit), nothing stays half
        # applied: the previous recipe comes back and the action ends failed, saying why
        error = str(exc) if isinstance(exc, SupervisorError | ActionFailed) else _said(exc)
        if steps.steps[-1]["status"] == "running":
            steps.end(_first_line(error), status="failed")
        steps.keep_log()
        _bring_back(supervisor, steps, engine, old_data, new_files, package)
        with contextlib.suppress(ApiError):
            steps.finish("failed", error=error)
        raise ActionFailed(error) from None
    observed = {
        "engine": identity.get("engine"),
        "version": identity.get("version"),
        "max_running_requests": identity.get("max_running_requests"),
        "checks": [sentence for sentence, _ in checks],
        "pid": state["pid"],
    }
    status = "sweeping" if payload.get("resweep") else "succeeded"
    if status == "sweeping":
        steps.steps.append(
            {"name": "re-sweep", "status": "queued", "detail": "next on this worker",
             "at": time.time()}
        )  # fmt: skip
    steps.finish(status, observed=observed)
    return status


def _said(exc):
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _first_line(text):
    return (text.splitlines() or [""])[0]


def _bring_back(supervisor, steps, engine, old_data, new_files, package):
    """After a failed change: the previous recipe runs again with its kernel configs (or, on a
    first start, the engine stays stopped)."""
    deployment = steps.deployment
    supervisor.stop(deployment)
    if not old_data:
        steps.begin("revert", "no earlier recipe: the engine stays stopped")
        steps.end()
        return
    folder = config_folder(supervisor, old_data)
    old_files = old_data.get("kernel_files") or []
    steps.begin("revert", f"starting the previous recipe v{old_data['version']} again")
    try:
        _install(engine, folder, old_files, remove=new_files, package=package)
        state = supervisor.start(_recipe(old_data, folder), on_wait=steps.waiting)
    except Exception as exc:
        steps.end(f"it did not come back either: {_first_line(_said(exc))}", status="failed")
        return
    steps.end(f"the previous recipe runs again (pid {state['pid']})")
