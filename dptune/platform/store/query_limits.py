"""What one results-store query may use (memory, threads, time): read by `dptune query`'s flags
without importing DuckDB."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import UserError


@dataclass(frozen=True)
class QueryLimits:
    """What one query may use, set before DuckDB's configuration is locked: a store is often read by
    a shared dashboard, where one ``SELECT`` over ``range(1e10)`` must not take the machine."""

    memory: str = "2GB"        #: DuckDB's ``memory_limit`` (nothing spills to disk)
    threads: int = 2           #: DuckDB's worker threads
    timeout_s: float = 120.0   #: the query is interrupted after this long

    def __post_init__(self) -> None:
        if not re.fullmatch(r"\d+(\.\d+)?\s*[KMGT]i?B", self.memory, re.IGNORECASE):
            raise UserError(f"memory limit must be a size like 512MB or 4GB; got {self.memory!r}")
        if self.threads < 1:
            raise UserError(f"threads must be at least 1; got {self.threads}")
        if not self.timeout_s > 0:
            raise UserError(f"timeout must be a positive number of seconds; got {self.timeout_s}")
