"""Thin wrapper: the same as the `vit-visualize` command (see README)."""

from vit.entry import visualize

if __name__ == "__main__":
    visualize()
