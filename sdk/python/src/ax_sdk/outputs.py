"""A task's outputs: what it writes to the file named by $AX_OUTPUT, as the Rust worker reads it.

`KEY=VALUE` lines and `KEY<<DELIMITER` ... `DELIMITER` blocks (GitHub Actions' $GITHUB_OUTPUT
format); a key is `[A-Za-z_][A-Za-z0-9_]*`, a key written twice keeps its last value, blank lines
are ignored. A file larger than MAX_ATTEMPT_BYTES or not in that form is refused whole, naming
the line, with the Rust worker's words (`ax_core::outputs`): a truncated value is a wrong one.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Dict, Mapping

from ax_sdk.convert import to_json

MAX_ATTEMPT_BYTES = 64 * 1024

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class OutputsError(ValueError):
    """$AX_OUTPUT cannot be read as outputs."""


def parse(data: bytes) -> Dict[str, str]:
    if len(data) > MAX_ATTEMPT_BYTES:
        raise OutputsError(
            f"$AX_OUTPUT holds {len(data)} bytes, more than the {MAX_ATTEMPT_BYTES} an attempt may pass on"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise OutputsError("$AX_OUTPUT is not UTF-8 text") from None
    outputs: Dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line, at = lines[i], i + 1
        i += 1
        if not line.strip():
            continue
        eq, heredoc = line.find("="), line.find("<<")
        if eq >= 0 and (heredoc < 0 or eq < heredoc):
            key, value = line[:eq], line[eq + 1 :]
        elif heredoc >= 0:
            key, delimiter = line[:heredoc], line[heredoc + 2 :]
            if not delimiter.strip():
                raise OutputsError(f"$AX_OUTPUT line {at}: a block needs a delimiter after <<")
            block = []
            while i < len(lines) and lines[i] != delimiter:
                block.append(lines[i])
                i += 1
            if i >= len(lines):
                raise OutputsError(f'$AX_OUTPUT line {at}: the block is not closed by a line "{delimiter}"')
            i += 1
            value = "\n".join(block)
        else:
            raise OutputsError(f"$AX_OUTPUT line {at}: expected KEY=VALUE or KEY<<DELIMITER")
        if not _KEY.match(key):
            raise OutputsError(f'$AX_OUTPUT line {at}: "{key}" is not a valid output name ([A-Za-z_][A-Za-z0-9_]*)')
        outputs[key] = value
    return outputs


def render(outputs: Mapping[str, str]) -> str:
    """The text of $AX_OUTPUT for `outputs`: a line per value, a block for a value of several."""
    parts = []
    for key, value in outputs.items():
        if not _KEY.match(key):
            raise OutputsError(f'"{key}" is not a valid output name ([A-Za-z_][A-Za-z0-9_]*)')
        if "\n" in value or "\r" in value:
            delimiter = f"AX_EOF_{uuid.uuid4().hex}"
            parts.append(f"{key}<<{delimiter}\n{value}\n{delimiter}\n")
        else:
            parts.append(f"{key}={value}\n")
    return "".join(parts)


def from_return(value: Any) -> Dict[str, str]:
    """A function's return value as outputs: the output `return` holds it as JSON
    (`convert.to_json`: dataclasses, pydantic models, enums and dates included), so a function
    below takes it whole as an argument. A dict also gives one output per key that is a valid
    output name (a string as it is, anything else as JSON), for shell tasks below to read as
    `${tasks.T.outputs.KEY}`; a key named `return` is the dict's own."""
    outputs: Dict[str, str] = {"return": to_json(value)}
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str) and _KEY.match(key):
                outputs[key] = item if isinstance(item, str) else to_json(item)
    return outputs


def env_name(task: str, key: str) -> str:
    """`AX_UPSTREAM_<TASK>_<KEY>`, as the scheduler names an upstream's output."""
    mangled = "".join(c.upper() if c.isascii() and c.isalnum() else "_" for c in task)
    return f"AX_UPSTREAM_{mangled}_{key}"
