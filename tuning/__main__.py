"""`python -m tuning params|filename|tune|bench|engine-diff|compile-check …`: one subcommand per
module of the package."""

import argparse
import importlib
import sys

# Each module exposes add_arguments(parser) and run(args) -> exit status.
SUBCOMMANDS = {
    "params": "tuning.moe_params",
    "filename": "tuning.config_files",
    "tune": "tuning.tune_cli",
    "bench": "tuning.bench",
    "engine-diff": "tuning.engine_diff_cli",
    "compile-check": "tuning.compile_check",
}


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser, with a subparser for each subcommand module."""
    parser = argparse.ArgumentParser(prog="python -m tuning", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        summary = (module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else None
        subparser = subparsers.add_parser(command, help=summary, description=summary)
        module.add_arguments(subparser)
        subparser.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse argv and run the chosen subcommand; returns its exit status."""
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
