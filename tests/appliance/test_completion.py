"""Shell completion (click's, through the console script `ckptgw`) works and is documented
(issue 39, CLI)."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from appliance.cli import main

REPO = Path(__file__).resolve().parents[2]


def complete(words: str) -> list[str]:
    parts = words.split(" ")
    r = CliRunner().invoke(main, [], prog_name="ckptgw", env={
        "_CKPTGW_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1)})
    assert r.exit_code == 0, r.output
    return [line.split(",", 1)[1] for line in r.output.splitlines()]


def test_commands_subcommands_and_choices_complete():
    assert complete("ckptgw ret") == ["retention"]
    assert complete("ckptgw retention ") == ["apply", "log", "plan"]
    assert complete("ckptgw ls --state ") == ["dirty", "queued", "uploading", "clean", "absent"]
    assert "--token-file" in complete("ckptgw status --tok")


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_completion_scripts_are_generated(shell):
    r = CliRunner().invoke(main, [], prog_name="ckptgw", env={"_CKPTGW_COMPLETE": f"{shell}_source"})
    assert r.exit_code == 0 and "_CKPTGW_COMPLETE" in r.output


def test_the_readme_says_how_to_turn_it_on():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["ckptgw"] == "appliance.cli:main"         # the variable's name comes from it
    text = (REPO / "README.md").read_text()
    for shell in ("bash", "zsh", "fish"):
        assert f"_CKPTGW_COMPLETE={shell}_source ckptgw" in text
