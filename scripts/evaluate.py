"""Thin wrapper: the same as the `vit-evaluate` command (see README)."""

from vit.entry import evaluate

if __name__ == "__main__":
    evaluate()
