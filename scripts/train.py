"""Thin wrapper: the same as the `vit-train` command (see README)."""

from vit.cli import train_main

if __name__ == "__main__":
    train_main()
