"""Which of the values a vLLM reports it runs with are not its defaults, asked of that vLLM.

vLLM's /server_info lists every value of its configuration (some 350) and every VLLM_* variable
(some 260), defaults included, and does not say which it was given. Its defaults for a model are
what the same vLLM resolves for the same model with no flags and no VLLM_* variables: the
process answering on the engine's port (on this host) is found, and its own Python, in its own
folder and environment less the VLLM_* variables, builds that configuration
(EngineArgs(model).create_engine_config(), dumped as /server_info dumps its own). Built once per
interpreter, engine version, model and visible GPUs, and kept under the cache folder: it imports
vLLM, some 10 s.

`defaults_differing(identity)` returns {"args": {key: default}, "env": {name: default}} of what
the engine reported that is not its default (None where the default has no such key), or
{"error": sentence} where they cannot be read.
"""

import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from domain import engine as reports
from tuning.cache_dir import cache_dir

DEFAULTS_TIMEOUT_S = 180.0
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})

# Run by the engine's own Python: argv[1] the model, argv[2] the file to write.
_SCRIPT = r"""
import json, sys
import pydantic
import vllm.envs as envs
from vllm.config import VllmConfig
from vllm.engine.arg_utils import EngineArgs

config = EngineArgs(model=sys.argv[1]).create_engine_config()
dumped = pydantic.TypeAdapter(VllmConfig).dump_python(config, mode="json", fallback=str)
try:
    from vllm.config.utils import normalize_value
except ImportError:
    normalize_value = lambda value: value
env = {}
for key in dir(envs):
    if key.startswith("VLLM_") and "KEY" not in key:
        value = getattr(envs, key, None)
        if value is not None:
            env[key] = normalize_value(value)
with open(sys.argv[2], "w") as out:
    json.dump({"vllm_config": dumped, "vllm_env": env}, out, default=str)
"""


class NoDefaults(Exception):
    """The defaults cannot be read; the message says why, in a sentence."""


def listening_process(base_url: str) -> psutil.Process:
    """The process listening on base_url's port on this host."""
    parts = urlsplit(base_url)
    if parts.hostname not in LOCAL_HOSTS:
        raise NoDefaults(f"the engine runs on {parts.hostname}, not on this worker's host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        connections = []
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    raise NoDefaults(f"no process of this worker's user listens on port {port}")


def _interpreter(cmdline, cwd, environ):
    """The Python as the engine's process was started with it (its argv[0]; for a console
    script, the interpreter its first line names): a virtualenv's python is a link to the base
    interpreter, which alone would not see the engine's packages."""
    if not cmdline:
        return None
    first = cmdline[0]
    if "/" not in first:
        return shutil.which(first, path=environ.get("PATH"))
    return str(Path(cwd, first))


def _cache_file(exe: str, version: str, model: str, env: dict) -> Path:
    key = json.dumps([exe, version, model, env.get("CUDA_VISIBLE_DEVICES")])
    return cache_dir() / "engine-defaults" / f"{hashlib.sha256(key.encode()).hexdigest()}.json"


def vllm_defaults(process: psutil.Process, model: str, version: str) -> dict:
    """{"args": …, "env": …} that the vLLM of `process` resolves for `model` with no flags, in
    domain.engine's flattened form."""
    try:
        cwd, environ = process.cwd(), process.environ()
        exe = _interpreter(process.cmdline(), cwd, environ) or process.exe()
    except (psutil.AccessDenied, psutil.NoSuchProcess) as exc:
        raise NoDefaults(f"the engine's process could not be read ({type(exc).__name__})") from None
    env = {k: v for k, v in environ.items() if not k.startswith("VLLM_")}
    # the model as the engine was given it, from the engine's folder (its report names it so);
    # the cache knows it by where it is
    where = Path(cwd, model)
    cached = _cache_file(exe, version, str(where) if where.exists() else model, env)
    if cached.exists():
        with cached.open() as file:
            return json.load(file)
    with tempfile.TemporaryDirectory() as folder:
        written = Path(folder) / "defaults.json"
        try:
            done = subprocess.run(
                [exe, "-c", _SCRIPT, model, str(written)],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=DEFAULTS_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NoDefaults(f"the engine's Python could not build its defaults: {exc}") from None
        if done.returncode != 0 or not written.exists():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise NoDefaults(f"the engine's Python could not build its defaults: {last}")
        body = json.loads(written.read_text())
    defaults = {
        "args": reports.vllm_args(body["vllm_config"]),
        "env": reports.vllm_env(body["vllm_env"]),
    }
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(".part")
    partial.write_text(json.dumps(defaults))
    partial.replace(cached)
    return defaults


def defaults_differing(identity: dict) -> dict:
    """What of identify_engine's report (a vLLM's, from /server_info) is not the engine's
    default: {"args": {key: default}, "env": {name: default}}, or {"error": sentence}."""
    if identity.get("engine") != "vllm" or identity.get("args_source") != "/server_info":
        return {"error": "moeops reads the defaults of a vLLM that serves /server_info only"}
    args = identity.get("args") or {}
    model = args.get("model_config.model")
    if not isinstance(model, str):
        return {"error": "the engine reported no model_config.model"}
    try:
        process = listening_process(identity.get("url") or "")
        defaults = vllm_defaults(process, model, identity.get("version") or "")
    except NoDefaults as exc:
        return {"error": str(exc)}
    return {
        "args": reports.differing(args, defaults["args"]),
        "env": reports.differing(identity.get("env") or {}, defaults["env"]),
    }
