"""``jaxstow diff A B``: the leaves only in A, only in B, with another dtype or shape, or with other values.

Values are compared exactly; for differing arrays the largest absolute difference is shown. Exit status 1 when the
files differ, 0 when every leaf is the same.

>>> import os, tempfile, jax.numpy as jnp, jaxstow
>>> from jaxstow.cli import main
>>> folder = tempfile.mkdtemp()
>>> a, b = os.path.join(folder, "a.jxs"), os.path.join(folder, "b.jxs")
>>> jaxstow.save(a, {"w": jnp.ones(3), "b": jnp.zeros(2), "lr": 0.1})
>>> jaxstow.save(b, {"w": jnp.array([1.0, 1.5, 1.0]), "b": jnp.zeros(2, jnp.int32), "depth": 2})
>>> main(["diff", a, b])
path   difference
b      dtype float32 -> int32
depth  only in B
lr     only in A
w      values differ: 1 of 3 elements, max |A - B| = 0.5
4 of 4 leaves differ
1
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from jaxstow._read.reader import Reader
from jaxstow.cli.files import Leaf, describe, open_file, read_arrays
from jaxstow.cli.inspect import value_text
from jaxstow.cli.output import Table, print_json

__all__ = ["HELP", "arguments", "compare_arrays", "differences", "run"]


#: The line of ``jaxstow --help`` that names this command.
HELP = "compare two files leaf by leaf; exit status 1 when they differ"


def arguments(parser: argparse.ArgumentParser) -> None:
    """Compare two jaxstow, safetensors or npz files leaf by leaf: leaves only in A, only in B, with another dtype or
    shape, or with other values (with the largest absolute difference). Exit status 1 when they differ, 0 when they are
    the same."""
    parser.add_argument("a", metavar="A", help="a file (a path or an fsspec URL)")
    parser.add_argument("b", metavar="B", help="the file to compare it with")
    parser.add_argument("--json", action="store_true", help="print the differences as JSON, for scripts")


def run(args: argparse.Namespace) -> int:
    with open_file(args.a) as first, open_file(args.b) as second:
        found, compared = differences(first, second)
    if args.json:
        print_json({"a": args.a, "b": args.b, "same": not found, "leaves": compared, "differences": found})
        return 1 if found else 0
    if not found:
        print(f"the same: {compared} leaves")
        return 0
    table = Table(["path", "difference"])
    for item in found:
        table.add(item["path"] or "(root)", item["difference"])
    table.show()
    print(f"{len(found)} of {compared} leaves differ")
    return 1


def differences(first: Reader, second: Reader) -> tuple[list[dict[str, Any]], int]:
    """The differing leaves of two files (path, kind of difference, text), and how many leaf paths were compared."""
    a = {leaf.path: leaf for leaf in describe(first)}
    b = {leaf.path: leaf for leaf in describe(second)}
    found: list[dict[str, Any]] = []
    both: list[tuple[Leaf, Leaf]] = []
    for path in sorted(a.keys() | b.keys()):
        left, right = a.get(path), b.get(path)
        if left is None or right is None:
            side = "B" if left is None else "A"
            found.append({"path": path, "kind": f"only in {side}", "difference": f"only in {side}"})
        elif left.stored != right.stored:
            what = "an array in A, a value in B" if left.stored else "a value in A, an array in B"
            found.append({"path": path, "kind": "kind", "difference": what})
        elif not left.stored:
            if left.value != right.value:
                text = f"value {value_text(left.value, 30)} -> {value_text(right.value, 30)}"
                found.append({"path": path, "kind": "value", "difference": text})
        elif left.dtype != right.dtype:
            found.append({"path": path, "kind": "dtype", "difference": f"dtype {left.dtype} -> {right.dtype}"})
        elif left.shape != right.shape:
            found.append({"path": path, "kind": "shape", "difference": f"shape {left.shape} -> {right.shape}"})
        else:
            both.append((left, right))
    for left, right in both:  # one leaf at a time, so that memory holds two leaves at most
        change = compare_arrays(read_arrays(first, [left])[left.path], read_arrays(second, [right])[right.path])
        if change is not None:
            found.append({"path": left.path, "kind": "values", "difference": change})
    found.sort(key=lambda item: item["path"])
    return found, len(a.keys() | b.keys())


def compare_arrays(a: np.ndarray, b: np.ndarray) -> str | None:
    """``None`` if two arrays of one dtype and shape are equal (NaN equal to NaN), else what differs.

    >>> import numpy as np
    >>> from jaxstow.cli.diff import compare_arrays
    >>> compare_arrays(np.array([1.0, np.nan]), np.array([1.0, np.nan])) is None
    True
    >>> compare_arrays(np.array([1, 5, 3]), np.array([1, 2, 3]))
    'values differ: 1 of 3 elements, max |A - B| = 3'
    """
    if a.tobytes() == b.tobytes():
        return None
    try:
        wide_a, wide_b = _widen(a), _widen(b)
    except (TypeError, ValueError):  # a dtype with no arithmetic: compare bytes
        return "the bytes differ"
    unequal = ~((wide_a == wide_b) | (np.isnan(wide_a) & np.isnan(wide_b)))
    count = int(np.count_nonzero(unequal))
    if count == 0:
        return None  # the same numbers with other bytes (-0.0 and 0.0, NaN payloads)
    gap = np.abs(wide_a[unequal] - wide_b[unequal])
    largest = float(np.max(gap))
    return f"values differ: {count} of {a.size} elements, max |A - B| = {largest:.6g}"


def _widen(array: np.ndarray) -> np.ndarray:
    """An array as float64 or complex128, for differences that neither overflow nor wrap around."""
    if np.issubdtype(array.dtype, np.complexfloating):
        return array.astype(np.complex128)
    return array.astype(np.float64)
