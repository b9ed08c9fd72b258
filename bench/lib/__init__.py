"""What the bench's subcommands share (see bench/__init__.py)."""
