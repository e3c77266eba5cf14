"""Thin wrapper: the same as the `vit-evaluate` command (see README)."""

from vit.cli import evaluate_main

if __name__ == "__main__":
    evaluate_main()
