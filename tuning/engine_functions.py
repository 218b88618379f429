"""An engine's own functions, taken out of its source files with `ast` and run here with
stand-ins for what they ask, without importing the engine or torch (tuning.engine_paths
evaluates the engine's decisions of its fast paths with them).

`EngineFunctions(package, standins).load(relpath, name)` returns the engine's top-level function
or class `name` of relpath, executed in a namespace where each name it reads is, in turn: a
stand-in; a few safe names (`Enum`, `NamedTuple`, `functools`); the engine's own definition of
it (in the same file, or the file it imports it from, followed once through a re-export); a
literal the file sets at its top (`_TABLE = {}`, `frozenset({...})`); else a `_Missing` that
makes the decision unknown when it is touched, naming the name. A function's own imports are
resolved the same way when they run (a ROCm-only import in a branch not taken costs nothing).
Annotations name no type. `assigned` evaluates a top-level assignment the same way.
"""

from __future__ import annotations

import ast
import enum
import functools
import textwrap
import typing
from dataclasses import dataclass
from pathlib import Path

from tuning.engine_source import EnginePackage, EngineSourceError, free_names

INTERFACE_FILE = "platforms/interface.py"
CUDA_FILE = "platforms/cuda.py"
# The engine's own capability checks a stand-in platform borrows (vllm/platforms/interface.py,
# and cuda.py's overrides).
PLATFORM_METHODS = (
    "has_device_capability",
    "is_device_capability",
    "is_device_capability_family",
    "support_deep_gemm",
)
# Names whose definitions the engine's files give without running anything else.
_SAFE = {
    "Enum": enum.Enum,
    "IntEnum": enum.IntEnum,
    "auto": enum.auto,
    "NamedTuple": typing.NamedTuple,
    "Any": typing.Any,
    "TYPE_CHECKING": False,
    "cache": functools.cache,
    "lru_cache": functools.lru_cache,
    "functools": functools,
}


class PathUnknown(Exception):
    """A decision cannot be evaluated; the message names the function, the version and why."""


@dataclass(frozen=True)
class Capability:
    """A compute capability, "12.0" → (12, 0)."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> Capability:
        try:
            major, _, minor = str(text).strip().partition(".")
            return cls(int(major), int(minor or 0))
        except ValueError:
            raise ValueError(f"{text!r} is not a compute capability such as 12.0") from None

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


_NO_LITERAL = object()


class _Missing:
    """A name the stand-ins do not give: touching it makes the decision unknown."""

    def __init__(self, name: str, where: str):
        self._name, self._where = name, where

    def _fail(self, *args, **kwargs):
        raise PathUnknown(f"uses {self._name}{self._where}, for which moeops has no stand-in")

    __call__ = __bool__ = __iter__ = __eq__ = __hash__ = __lt__ = __gt__ = _fail

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        self._fail()


class Fields:
    """A configuration holding only the given fields; reading another makes the decision
    unknown, naming the field."""

    def __init__(self, path: str, **fields):
        self._path = path
        self.__dict__.update(fields)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise PathUnknown(f"reads {self._path}.{name}, which moeops' stand-in does not hold")


# ---------------------------------------------------------------------------- reading the source


class EngineFunctions:
    """The engine package's files as modules of top-level definitions, resolved on demand."""

    def __init__(self, package: EnginePackage, standins: dict):
        self.package = package
        self.standins = standins
        self._trees: dict[str, ast.Module] = {}
        self._texts: dict[str, str] = {}

    def tree(self, relpath: str) -> ast.Module:
        if relpath not in self._trees:
            text, tree = _parsed(self.package, relpath)
            self._texts[relpath] = text
            self._trees[relpath] = tree
        return self._trees[relpath]

    def module_file(self, module: str, level: int, relpath: str) -> str | None:
        """The package-relative file of an imported module ("vllm.platforms.interface", or
        ".interface" from relpath), or None when it is not the engine's."""
        top = self.package.package_dir.name
        if level:
            base = Path(relpath).parent.parts[: len(Path(relpath).parent.parts) - (level - 1)]
            parts = [*base, *(module.split(".") if module else [])]
        elif module == top or module.startswith(top + "."):
            parts = module.split(".")[1:]
        else:
            return None
        for candidate in ("/".join(parts) + ".py", "/".join([*parts, "__init__.py"])):
            if (self.package.package_dir / candidate).is_file():
                return candidate
        return None

    def definition(self, relpath: str, name: str):
        """The top-level def or class `name` of a file, following a re-export once."""
        tree = self.tree(relpath)
        for node in tree.body:
            is_def = isinstance(node, ast.FunctionDef | ast.ClassDef)
            if is_def and node.name == name:
                return relpath, node
        imported = self.imports(relpath).get(name)
        if imported is not None:
            module, level, original = imported
            target = self.module_file(module, level, relpath)
            if target is not None and target != relpath:
                tree = self.tree(target)
                for node in tree.body:
                    is_def = isinstance(node, ast.FunctionDef | ast.ClassDef)
                    if is_def and node.name == original:
                        return target, node
        return None

    def imports(self, relpath: str) -> dict[str, tuple[str, int, str]]:
        """{bound name: (module, level, imported name)} of a file's top-level imports."""
        found = {}
        for node in self.tree(relpath).body:
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    bound = alias.asname or alias.name
                    found[bound] = (node.module or "", node.level, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    found[alias.asname or alias.name.split(".")[0]] = (alias.name, 0, "")
        return found

    def source_of(self, relpath: str, node) -> str:
        text = self._texts[relpath]
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        return "".join(text.splitlines(keepends=True)[first - 1 : node.end_lineno])

    def load(self, relpath: str, name: str, *, depth: int = 0):
        """The engine's own def or class `name` of relpath, executed with its free names
        resolved: stand-ins first, then the engine's definitions (same file, then the file it
        imports the name from), else a _Missing that fails when touched."""
        found = self.definition(relpath, name)
        if found is None:
            raise PathUnknown(f"{self.package.title}'s {relpath} defines no {name}")
        where, node = found
        source = _without_imports_and_annotations(self.source_of(where, node))
        namespace = {"__name__": f"moeops_engine_paths_{name}", "__moeops_import__": None}
        namespace["__moeops_import__"] = functools.partial(self._import, where, depth)
        for free in _free_names(source):
            namespace[free] = self.resolve(where, free, depth=depth)
        return self._run(source, namespace, name, where)

    def _run(self, source: str, namespace: dict, name: str, relpath: str):
        """namespace[name] once source, read from the engine's relpath, ran in namespace; an
        error of the engine's code is a PathUnknown naming it."""
        try:
            exec(compile(source, f"<{self.package.title} {relpath}>", "exec"), namespace)
        except PathUnknown:
            raise
        except Exception as exc:
            raise PathUnknown(f"{name} of {relpath} does not load here: {exc}") from None
        return namespace[name]

    def resolve(self, relpath: str, name: str, *, depth: int = 0):
        if name in self.standins:
            return self.standins[name]
        if name in _SAFE:
            return _SAFE[name]
        if depth < 3:
            try:
                if self.definition(relpath, name) is not None:
                    return self.load(relpath, name, depth=depth + 1)
            except (PathUnknown, EngineSourceError, SyntaxError):
                pass
        literal = self.literal(relpath, name)
        if literal is not _NO_LITERAL:
            return literal
        origin = self.imports(relpath).get(name)
        where = f" (from {origin[0] or '.'})" if origin else ""
        return _Missing(name, where)

    def literal(self, relpath: str, name: str):
        """The value of a top-level `name = <literal>` of the file (a table a module starts
        empty, a cutoff), else _NO_LITERAL."""
        for node in self.tree(relpath).body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return _literal(value)
        return _NO_LITERAL

    def _import(self, relpath: str, depth: int, module: str, level: int, name: str):
        """What a function's own `from module import name` binds: a stand-in, else the engine's
        definition in that module, else a _Missing."""
        if name in self.standins:
            return self.standins[name]
        target = self.module_file(module, level, relpath)
        if target is not None and depth < 3:
            try:
                return self.load(target, name, depth=depth + 1)
            except (PathUnknown, EngineSourceError, SyntaxError):
                pass
        return _Missing(name, f" (from {module})")

    def assigned(self, relpath: str, name: str):
        """The value of a top-level `name = <expression>` of relpath (SGLang's probes:
        `is_sm100_supported = lru_cache(maxsize=1)(partial(_check_cuda_device_version, …))`),
        the expression run with its free names resolved as load resolves a function's."""
        for node in self.tree(relpath).body:
            if not isinstance(node, ast.Assign):
                continue
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                source = f"{name} = {ast.unparse(node.value)}"
                namespace = {free: self.resolve(relpath, free) for free in _free_names(source)}
                return self._run(source, namespace, name, relpath)
        if self.definition(relpath, name) is not None:
            return self.load(relpath, name)
        raise PathUnknown(f"{self.package.title}'s {relpath} sets no {name}")

    def class_constant(self, relpath: str, cls: str, name: str):
        """A literal a class body sets (`_SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]`)."""
        for node in self.tree(relpath).body:
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for item in node.body:
                    targets = item.targets if isinstance(item, ast.Assign) else []
                    if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                        try:
                            return ast.literal_eval(item.value)
                        except ValueError:
                            break
        raise PathUnknown(f"{self.package.title}'s {relpath} sets no literal {cls}.{name}")


# A table a module sets as `frozenset({...})` is as literal as its braces.
_LITERAL_CALLS = {"frozenset": frozenset, "set": set, "tuple": tuple, "list": list}


def _literal(value: ast.expr):
    """The value of a literal expression, or of a frozenset/set/tuple/list of one, else
    _NO_LITERAL."""
    call = value if isinstance(value, ast.Call) else None
    if call is not None:
        name = getattr(call.func, "id", None)
        if name not in _LITERAL_CALLS or call.keywords or len(call.args) != 1:
            return _NO_LITERAL
        value = call.args[0]
    try:
        found = ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError):
        return _NO_LITERAL
    return _LITERAL_CALLS[call.func.id](found) if call is not None else found


@functools.lru_cache(maxsize=64)
def _parsed_file(path: Path, mtime_ns: int) -> tuple[str, ast.Module]:
    text = path.read_text()
    return text, ast.parse(text)


def _parsed(package: EnginePackage, relpath: str) -> tuple[str, ast.Module]:
    """A file's text and tree, parsed once per version of the file (a decision is evaluated
    over every capability of CAPABILITIES)."""
    path = package.package_dir / relpath
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        package.read(relpath)  # raises EngineSourceError naming the file and why
        raise
    return _parsed_file(path, mtime)


class _Rewrite(ast.NodeTransformer):
    """A function's own imports become calls of the resolver (run when reached, as the engine
    runs them), and annotations name no type (they name the engine's types)."""

    def visit_ImportFrom(self, node):
        return [
            ast.Assign(
                targets=[ast.Name(alias.asname or alias.name, ast.Store())],
                value=ast.Call(
                    ast.Name("__moeops_import__", ast.Load()),
                    [ast.Constant(node.module or ""), ast.Constant(node.level)],
                    [ast.keyword("name", ast.Constant(alias.name))],
                ),
                lineno=node.lineno,
            )
            for alias in node.names
        ]

    def visit_Import(self, node):
        return [
            ast.Assign(
                targets=[ast.Name(alias.asname or alias.name.split(".")[0], ast.Store())],
                value=ast.Call(
                    ast.Name("__moeops_import__", ast.Load()),
                    [ast.Constant(alias.name), ast.Constant(0)],
                    [ast.keyword("name", ast.Constant(""))],
                ),
                lineno=node.lineno,
            )
            for alias in node.names
        ]

    def visit_arg(self, node):
        node.annotation = None
        return node

    def visit_FunctionDef(self, node):
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node):
        # kept, as a string: a NamedTuple's fields are its class body's annotations
        node.annotation = ast.Constant("object")
        return node


def _without_imports_and_annotations(source: str) -> str:
    tree = _Rewrite().visit(ast.parse(textwrap.dedent(source)))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and not body:
            node.body = [ast.Pass()]
    return ast.unparse(ast.fix_missing_locations(tree))


def _free_names(source: str) -> set[str]:
    """Names the source reads at module level that it never binds (its globals)."""
    return free_names(source) - {"__moeops_import__"}


# ---------------------------------------------------------------------------- stand-ins


def _methods(source: EngineFunctions, relpath: str, cls: str, names) -> dict:
    """The named methods of a class of the engine's file, as plain functions."""
    found = source.definition(relpath, cls)
    if found is None:
        raise PathUnknown(f"{source.package.title}'s {relpath} defines no {cls}")
    methods = {}
    for item in found[1].body:
        if isinstance(item, ast.FunctionDef) and item.name in names:
            text = _without_imports_and_annotations(source.source_of(relpath, item))
            namespace = {}
            exec(compile(text, f"<{source.package.title} {relpath}>", "exec"), namespace)
            methods[item.name] = namespace[item.name]
    return methods


def stand_in_platform(source: EngineFunctions, capability: Capability | None):
    """A `current_platform` answering for capability (None: the CPU build), its capability
    checks the engine's own: Platform's methods in vllm/platforms/interface.py, and on a CUDA
    GPU CudaPlatformBase's overrides in vllm/platforms/cuda.py."""
    device_capability = source.load(INTERFACE_FILE, "DeviceCapability")
    here = device_capability(capability.major, capability.minor) if capability else None
    methods = _methods(source, INTERFACE_FILE, "Platform", PLATFORM_METHODS)
    missing = [name for name in PLATFORM_METHODS if name not in methods]
    if missing:
        raise PathUnknown(f"{source.package.title}'s Platform has no {missing[0]}")
    cuda = capability is not None
    if cuda:
        methods.update(_methods(source, CUDA_FILE, "CudaPlatformBase", PLATFORM_METHODS))

    class StandInPlatform:
        @classmethod
        def get_device_capability(cls, device_id=0):
            return here

        is_cuda = staticmethod(lambda: cuda)
        is_cuda_alike = staticmethod(lambda: cuda)
        is_cpu = staticmethod(lambda: not cuda)
        is_rocm = is_xpu = is_tpu = is_out_of_tree = staticmethod(lambda: False)

        def __getattr__(self, name):
            raise PathUnknown(f"asks current_platform.{name}, which moeops' stand-in lacks")

    for name, method in methods.items():
        setattr(StandInPlatform, name, method)
    return StandInPlatform(), device_capability


class StandInLogger:
    """The engine's logger: its messages go nowhere here."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class StandInEnvs:
    """vLLM's `envs` with the launch's values of the switches the decisions read."""

    def __init__(self, env: dict | None):
        self._env = dict(env or {})

    def _switch(self, name: str, default: str) -> bool:
        return str(self._env.get(name, default)).strip() not in ("", "0")

    @property
    def VLLM_BATCH_INVARIANT(self) -> bool:  # noqa: N802 (the engine's name)
        return self._switch("VLLM_BATCH_INVARIANT", "0")

    @property
    def VLLM_USE_DEEP_GEMM(self) -> bool:  # noqa: N802
        return self._switch("VLLM_USE_DEEP_GEMM", "1")

    def is_set(self, name: str) -> bool:
        return name in self._env

    def __getattr__(self, name):
        raise PathUnknown(f"reads envs.{name}, which moeops' stand-in does not hold")


class EnumNames:
    """An enum of names whose members only name themselves (AttentionBackendEnum.FLASH_ATTN is
    "FLASH_ATTN", as the engine's log writes it)."""

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return name
