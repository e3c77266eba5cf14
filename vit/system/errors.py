"""How the console commands report a mistake the user can fix: one line on stderr, exit status 2."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, IsADirectoryError)


def exit_on_user_error(run: Callable[[], Any]) -> None:
    """Run a command; a mistake the user can fix prints its message (no traceback) and exits 2."""
    try:
        run()
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
