"""One command with subcommands over a folder of tools (``python -m tools.bench``, ``tools.data``).

Each subcommand is a module that keeps its own argument parser and ``main()``; the command only
picks the module and hands it the arguments after the subcommand's name. Modules are imported on
demand, so ``--help`` and one tool's run do not pay for the others' imports.
"""

from __future__ import annotations

import importlib
import sys
from typing import Dict, List, NamedTuple, Optional


class Command(NamedTuple):
    module: str  # e.g. "tools.bench.run"; it has main(), reading its arguments from sys.argv
    summary: str  # one line for the command's listing


def usage(prog: str, description: str, commands: Dict[str, Command]) -> str:
    width = max(map(len, commands))
    lines = [f"usage: {prog} SUBCOMMAND [ARGS...]   ({prog} SUBCOMMAND --help for its arguments)", "",
             description.strip(), "", "subcommands:"]
    lines += [f"  {name:<{width}}  {command.summary}" for name, command in commands.items()]
    return "\n".join(lines)


def dispatch(prog: str, description: str, commands: Dict[str, Command], argv: Optional[List[str]] = None) -> None:
    """Run the subcommand named by ``argv[0]`` (default: the command line) and exit with its status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(prog, description, commands), file=sys.stdout if argv else sys.stderr)
        sys.exit(0 if argv else 2)
    name, rest = argv[0], argv[1:]
    if name not in commands:
        sys.exit(f"{prog}: error: unknown subcommand {name!r}; choose from {', '.join(commands)}")
    module = importlib.import_module(commands[name].module)
    # The tools' parsers read sys.argv (argparse also takes its usage line's program name from it).
    sys.argv = [f"{prog} {name}", *rest]
    sys.exit(module.main())
