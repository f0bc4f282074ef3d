"""What every spec shares: :class:`ConfigError` (names the key, the value and what is valid), the byte units,
and the small invariant checks the spec dataclasses run at construction."""

from __future__ import annotations

from typing import Any

GiB = 1024**3
GB = 1000**3


class ConfigError(ValueError):
    """Bad input: names the key, the value and what is valid."""

    def __init__(self, key: str, value: Any, valid: str):
        self.key, self.value, self.valid = key, value, valid
        super().__init__(f"{key}={value!r}: {valid}")


def positive_int(obj: object, *names: str) -> None:
    for name in names:
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(name, v, "must be a positive integer")


def positive_num(obj: object, *names: str) -> None:
    for name in names:
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise ConfigError(name, v, "must be a positive number")


def one_of(obj: object, name: str, allowed: tuple) -> None:
    v = getattr(obj, name)
    if v not in allowed:
        raise ConfigError(name, v, "must be one of " + ", ".join(map(str, allowed)))
