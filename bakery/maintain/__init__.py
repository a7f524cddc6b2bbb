"""The maintainer's loop: refresh patches from an edited tree, rebase onto a new pin."""
