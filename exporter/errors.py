"""Errors that reach a user: each names where the bad value came from."""

from __future__ import annotations


class InputError(Exception):
    """Bad input a user can fix: a file, a key in it, the value found there, and what to do.

    ``where`` is a file path, ``--flag`` or ``catalogue:NAME``; ``key`` is a dotted path
    inside it (``text_config.num_hidden_layers``) or empty when the whole input is wrong;
    ``value`` is None when the key is absent (a JSON null counts as absent too).
    """

    def __init__(self, where: str, key: str, value: object, problem: str) -> None:
        self.where = where
        self.key = key
        self.value = value
        self.problem = problem
        super().__init__(str(self))

    def __str__(self) -> str:
        place = f"{self.where}: {self.key}" if self.key else self.where
        shown = "" if self.value is None else f" = {self.value!r}"
        return f"{place}{shown}: {self.problem}"
