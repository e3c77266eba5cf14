"""Screenshot a vit-explore page in the system's headless Chromium (tests/browser.py).

    vit-explore vit-tiny-d4-cifar10-cpu60 --output explorer.html
    python scripts/explore_screenshot.py explorer.html docs/explorer.png \
        --click '#images [data-image="3"]' '#layers [data-layer="3"]' '#overlay [data-patch="27"]'
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the browser helper lives in tests/
from tests.browser import screenshot  # noqa: E402
from vit.system.errors import exit_on_user_error  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("html", type=Path, help="a page written by vit-explore")
    p.add_argument("png", type=Path, help="where the screenshot goes")
    p.add_argument("--click", nargs="*", default=[], help="CSS selectors to click first, in order")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=1000)
    ns = p.parse_args(argv)
    if not ns.html.is_file():
        raise FileNotFoundError(f"page {str(ns.html)!r} does not exist; write it with vit-explore.")
    path = screenshot(ns.html, ns.png, click=ns.click, width=ns.width, height=ns.height)
    print(f"wrote {path}")


if __name__ == "__main__":
    exit_on_user_error(main)
