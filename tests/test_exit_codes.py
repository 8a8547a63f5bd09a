"""One table of exit statuses for every ``neuron-args`` command: the CLI and the compile command import it."""
from __future__ import annotations

import ast
from pathlib import Path

from neuron_args import cli, exit_codes, farm_cli
from neuron_args.compilers import local_xla


def test_the_commands_share_one_exit_status_table():
    table = {name: value for name, value in vars(exit_codes).items() if name.startswith("EXIT_")}
    assert table == {"EXIT_OK": 0, "EXIT_FAIL": 1, "EXIT_USAGE": 2, "EXIT_REMOTE": 3, "EXIT_INTERRUPTED": 130}
    for module in (cli, farm_cli, local_xla):
        source = ast.parse(Path(module.__file__).read_text())
        own = [t.id for node in source.body if isinstance(node, ast.Assign) for t in ast.walk(node)
               if isinstance(t, ast.Name) and t.id.startswith("EXIT_")]
        assert own == [], f"{module.__name__} defines its own exit statuses {own}: import them from neuron_args.exit_codes"
        used = {name: value for name, value in vars(module).items() if name.startswith("EXIT_")}
        assert used and all(table[name] == value for name, value in used.items()), module.__name__
