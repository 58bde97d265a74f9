"""The `chatqna` command: its help names every subcommand, and `ask` prints a stream."""

from __future__ import annotations

import re

from chatqna import cli


def command_names() -> list[str]:
    return sorted(
        command.name or (command.callback.__name__ if command.callback else "")
        for command in cli.app.registered_commands
    )


def test_the_help_text_lists_every_command() -> None:
    summary = (cli.__doc__ or "").split("\n\n")[0].split(":", 1)[1]
    listed = sorted(re.findall(r"`(\w+)`", summary))
    assert listed == command_names()
    assert len(listed) == 5
