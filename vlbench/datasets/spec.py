"""Validation shared by every dataset source's spec (the `prepare` mapping of a dataset entry, `conf/dataset/<name>.yaml`).

Each source lists its allowed keys and calls `check_keys` first, so a typo is refused the same way everywhere:
one line naming the dataset, the source, the unknown key(s), the closest allowed key and the allowed keys.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from vlbench.datasets.canonical import DatasetError


def check_keys(name: str, spec: Mapping, allowed: Sequence[str], source: str | None = None) -> None:
    """Refuse keys of `spec` that are not in `allowed`; `source` defaults to the spec's own `source`."""
    unknown = sorted(str(k) for k in spec if k not in allowed)
    if not unknown:
        return
    close = [m for k in unknown for m in difflib.get_close_matches(k, allowed, n=1)]
    hint = f" (did you mean {', '.join(repr(m) for m in close)}?)" if close else ""
    raise DatasetError(
        f"dataset {name!r}: unknown spec key(s) {unknown} for source {source or spec.get('source')!r}{hint}; "
        f"allowed keys: {', '.join(allowed)}"
    )


def check_flag(name: str, spec: Mapping, key: str, default: bool = False) -> bool:
    """A true/false spec option (YAML `true`/`false`); anything else is refused."""
    value = spec.get(key, default)
    if not isinstance(value, bool):
        raise DatasetError(f"dataset {name!r}: {key!r} must be true or false, got {value!r}")
    return value
