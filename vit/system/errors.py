"""How the console commands report a mistake the user can fix (one line on stderr, exit status
2) and a Ctrl-C (one line, exit status 130)."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, IsADirectoryError)

# what a shell reports for a process that Ctrl-C (SIGINT) ended
CTRL_C_EXIT_STATUS = 128 + signal.SIGINT

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # vit/


def raised_in(err: BaseException, folder: Path) -> bool:
    """Whether the innermost frame of err's traceback runs a file under folder."""
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(folder)


def exit_on_user_error(
    run: Callable[[], Any],
    only_from: Path | None = None,
    anywhere: tuple[type[BaseException], ...] = (),
) -> None:
    """Run a command; a mistake the user can fix prints its message (no traceback) and exits 2.

    With only_from, only errors raised by code under that folder count as the user's: vit-train
    runs Lightning and torch for an hour, and a ValueError from inside them is more likely a bug
    whose traceback is the place to start than a message written for the user. Errors of the
    `anywhere` types count wherever they are raised (a library's own word for a bad setting).
    """
    try:
        run()
    except (*USER_ERRORS, *anywhere) as err:
        if (
            only_from is not None
            and not isinstance(err, anywhere)
            and not raised_in(err, only_from)
        ):
            raise
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def interruptible(command: Callable[[], None]) -> Callable[[], None]:
    """The command, ended by Ctrl-C with one line and exit status 130 instead of a traceback
    from whatever ran at that moment (an import, the config's parsing, a command's own loop).
    Inside a Lightning fit or test, Lightning's shutdown takes it and exits 1, which becomes
    130 here too (a fit's first Ctrl-C in its steps saves first and exits 130 by itself:
    vit/train/callbacks/checkpointing.py)."""

    @functools.wraps(command)
    def run() -> None:
        try:
            command()
        except KeyboardInterrupt:
            print("\nInterrupted by Ctrl-C.", file=sys.stderr)
            raise SystemExit(CTRL_C_EXIT_STATUS) from None
        except SystemExit as stop:
            # Lightning calls sys.exit(1) while it handles the KeyboardInterrupt, so the
            # interrupt is the exit's context; a command's own exit 1 has none
            if stop.code == 1 and isinstance(stop.__context__, KeyboardInterrupt):
                print("Interrupted by Ctrl-C.", file=sys.stderr)
                raise SystemExit(CTRL_C_EXIT_STATUS) from None
            raise

    return run
