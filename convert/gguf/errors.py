"""User-facing errors: one line naming the file, the field, the expected and the found value."""

from __future__ import annotations

from pathlib import Path

#: Exit code for a user's mistake (bad input file, mismatched pair, missing token...).
USER_ERROR_EXIT = 2


class UserError(Exception):
    """A mistake in what the user gave us; the CLI prints it on one line and exits with 2."""


class ContractError(UserError):
    """An input that breaks the drafter/target contract of SPEC §2."""

    def __init__(self, file: str | Path, field: str, expected: object, found: object) -> None:
        self.file = str(file)
        self.field = field
        self.expected = expected
        self.found = found
        super().__init__(f"{self.file}: {field}: expected {expected}, found {found}")
