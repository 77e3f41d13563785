"""Durations as people write them, read by the grammar of ax's Rust binaries
(`scheduler/core/src/duration.rs`), with the same error text; both are tested against the same
table of forms (`scheduler/core/tests/durations.json`).

    duration = number | part { [spaces] part }   a bare number is seconds
    part     = number [spaces] unit              units from the largest, each at most once
    number   = ["+"] digits ["." [digits]] | ["+"] "." digits
    unit     = "d" | "h" | "m" | "s" | "ms"      a day is 24 hours

Spaces around the whole are ignored; a duration is exact to the nanosecond and at most
2**64 - 1 milliseconds.
"""

import re

__all__ = ["DurationError", "parse", "parse_ns"]

_NANOS_PER_SEC = 1_000_000_000
_MAX_NANOS = (2**64 - 1) * 1_000_000 + 999_999
# Where the Rust parser's arithmetic stops: past it, the text is too large before it is read on.
_U128 = 2**128 - 1
# Units in the only order they may appear, with their length in nanoseconds.
_UNITS = (
    ("d", 86_400 * _NANOS_PER_SEC),
    ("h", 3_600 * _NANOS_PER_SEC),
    ("m", 60 * _NANOS_PER_SEC),
    ("s", _NANOS_PER_SEC),
    ("ms", 1_000_000),
)
_NUMBER = re.compile(r"\+?(?:([0-9]+)(?:\.([0-9]*))?|\.([0-9]+))")
_LETTERS = re.compile(r"[A-Za-z]*")


class DurationError(ValueError):
    """A text that is not a duration; the message quotes it."""


def _invalid(text: str) -> DurationError:
    return DurationError(
        f'invalid duration "{text}": expected a form like 500ms, 1.5s, 10m, 2h, 1h30m, 90d or a number of seconds'
    )


def _too_large(text: str) -> DurationError:
    return DurationError(f'duration "{text}" is too large')


def parse_ns(text: str) -> int:
    """The duration `text` reads as, in nanoseconds; DurationError when it is not one."""
    rest = text.strip()
    if not rest:
        raise _invalid(text)
    total = 0
    next_unit = 0
    first = True
    while rest:
        number = _NUMBER.match(rest)
        if not number:
            raise _invalid(text)
        whole = number.group(1) or ""
        fraction = (number.group(2) if number.group(1) is not None else number.group(3)) or ""
        after = rest[number.end() :].lstrip()
        matched = _LETTERS.match(after)
        letters = matched.group(0) if matched else ""
        if not letters:
            if not (first and not after):
                raise _invalid(text)
            unit_nanos, rest = _NANOS_PER_SEC, ""
        else:
            names = [name for name, _ in _UNITS[next_unit:]]
            if letters not in names:
                raise _invalid(text)
            next_unit += names.index(letters) + 1
            unit_nanos = _UNITS[next_unit - 1][1]
            rest = after[len(letters) :].lstrip()
        # Digits past the 18th are below a nanosecond for every unit.
        fraction = fraction[:18]
        nanos = int(whole or "0") * unit_nanos
        if fraction:
            nanos += int(fraction) * unit_nanos // 10 ** len(fraction)
        if nanos > _U128:
            raise _too_large(text)
        total += nanos
        if total > _U128:
            raise _too_large(text)
        first = False
    if total > _MAX_NANOS:
        raise _too_large(text)
    return total


def parse(text: str) -> float:
    """The duration `text` reads as, in seconds; DurationError when it is not one."""
    return parse_ns(text) / _NANOS_PER_SEC
