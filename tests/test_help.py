"""Every option of `vit-train fit --help` says what it is: one line from the docstrings."""

from __future__ import annotations

import re

import pytest

from vit.commands.train import train_main

OURS = ("--model.", "--data.", "--test_after_fit", "--bf16_fallback", "--float32_overrides")
CALLBACKS = (
    "TimeBudget",
    "ResolutionSchedule",
    "PatchDropSchedule",
    "EMA",
    "LastCheckpoint",
    "AttentionMapLogger",
)


def help_text(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        train_main(args)
    assert exit_.value.code == 0
    return capsys.readouterr().out


def undescribed(text: str, prefixes: tuple[str, ...]) -> list[str]:
    """Options whose help is only '(type: ..., default: ...)', or that show no default and are
    not required."""
    found, missing = 0, []
    # each option's entry: its line, then its help lines, up to the next option or section
    for match in re.finditer(r"^  (--\S+)[^\n]*\n((?:                +[^\n]*\n)*)", text, re.M):
        name, body = match.group(1), " ".join(match.group(2).split())
        if not name.startswith(prefixes) or name.endswith(".help"):
            continue
        if body == "Path to a configuration file.":  # a group's own entry (e.g. --model.network)
            continue
        found += 1
        description = re.split(r"\((?:required, )?type:", body)[0].strip()
        if not description:
            missing.append(name)
        elif "default:" not in body.lower() and "(required," not in body:
            missing.append(f"{name} (no default shown)")
    assert found, "no option of ours found in the help: the parser changed?"
    return missing


def test_every_model_and_data_option_has_a_description(capsys) -> None:
    text = help_text(["fit", "--help"], capsys)
    options = re.findall(r"^  (--(?:model|data)\.\S+) [^\n]*$", text, re.M)
    assert len(options) > 40  # the network, optimizer, schedule, loss and data options
    assert undescribed(text, OURS) == []


@pytest.mark.parametrize("name", CALLBACKS)
def test_every_callback_option_has_a_description(name: str, capsys) -> None:
    text = help_text(["fit", "--trainer.callbacks.help", f"vit.train.callbacks.{name}"], capsys)
    assert undescribed(text, ("--trainer.callbacks.",)) == []
