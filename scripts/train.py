"""Thin wrapper: the same as the `vit-train` command (see README)."""

from vit.entry import train

if __name__ == "__main__":
    train()
