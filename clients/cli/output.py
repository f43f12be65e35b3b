"""Where every command writes: results to stdout (`console`), the rest to stderr (`err`), so a
script reading a command's output gets only the result."""

from __future__ import annotations

from rich.console import Console

console = Console()
err = Console(stderr=True)
