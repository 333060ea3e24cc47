"""The errors a user can fix, as one type: the CLI prints them in one line and exits 2.

Anything else that escapes a command is a bug in dptune (exit 1, with a pointer to ``--traceback``).
:class:`UserError` is a ``ValueError`` and :class:`NotFound` a ``FileNotFoundError`` too, so code
that catches those keeps working. Standard library only: every package raises them.
"""
from __future__ import annotations


class UserError(ValueError):
    """A mistake in what the user gave (an argument, a spec, a name, a value out of range, a model
    or data the engine cannot train): the message says which and what is allowed."""


class NotFound(UserError, FileNotFoundError):
    """A file, folder, model or dataset the user named that does not exist or cannot be reached."""
