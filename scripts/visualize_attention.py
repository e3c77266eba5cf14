"""Thin wrapper: the same as the `vit-visualize` command (see README)."""

from vit.visualize import visualize_main

if __name__ == "__main__":
    visualize_main()
