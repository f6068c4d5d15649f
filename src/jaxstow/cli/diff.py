"""``jaxstow diff A B``: the leaves only in A, only in B, with another dtype or shape, or with other values; and where
the stored structures differ.

Values are compared exactly: integers in their own dtype (an int64 or uint64 beyond float64's 53 bits too), value leaves
with their types (``1``, ``True`` and ``1.0`` differ); for differing arrays the largest absolute difference is shown.
The structures (node kinds, classes and their static data) are compared node by node
(:mod:`jaxstow.cli.diff_structure`). Exit status 1 when the files differ, 0 when they are the same.

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

from jaxstow._read.per_process import stored_bytes
from jaxstow._read.reader import Reader
from jaxstow._util.progress import bar
from jaxstow.cli.diff_structure import flat_structure, same_value, structure_differences
from jaxstow.cli.files import Leaf, describe, open_file, read_arrays
from jaxstow.cli.inspect import value_text
from jaxstow.cli.output import Table, print_json

__all__ = ["HELP", "arguments", "compare_arrays", "differences", "run"]


#: The line of ``jaxstow --help`` that names this command.
HELP = "compare two files leaf by leaf; exit status 1 when they differ"


def arguments(parser: argparse.ArgumentParser) -> None:
    """Compare two jaxstow, safetensors or npz files leaf by leaf: leaves only in A, only in B, with another dtype or
    shape, or with other values (with the largest absolute difference); and their structures: where a node is of
    another kind or class, or a class's static data (hyperparameters) differ. Exit status 1 when they differ, 0 when
    they are the same."""
    parser.add_argument("a", metavar="A", help="a file (a path or an fsspec URL)")
    parser.add_argument("b", metavar="B", help="the file to compare it with")
    parser.add_argument("--json", action="store_true", help="print the differences as JSON, for scripts")
    parser.add_argument("--progress", action="store_true", help="show a progress bar of the bytes read (needs tqdm)")


def run(args: argparse.Namespace) -> int:
    with open_file(args.a) as first, open_file(args.b) as second:
        found, compared = differences(first, second, progress=args.progress)
    structural = [item for item in found if item["kind"] == "structure"]
    if args.json:
        report = {"a": args.a, "b": args.b, "same": not found, "leaves": compared, "differences": found}
        print_json({**report, "same_structure": not structural})
        return 1 if found else 0
    if not found:
        print(f"the same: {compared} leaves")
        return 0
    table = Table(["path", "difference"])
    for item in found:
        table.add(item["path"] or "(root)", item["difference"])
    table.show()
    if structural:
        print(f"the structure differs in {len(structural)} place{'s' * (len(structural) != 1)}")
    print(f"{len(found) - len(structural)} of {compared} leaves differ")
    return 1


def differences(first: Reader, second: Reader, *, progress: bool = False) -> tuple[list[dict[str, Any]], int]:
    """The differences of two files (path, kind of difference, text): each differing leaf, and each place their
    structures differ (kind ``"structure"``); and how many leaf paths were compared. ``progress``: draw a progress
    bar of the bytes of arrays read to compare values."""
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
        elif left.dtype == right.dtype == "per_process":  # each process's value, a file of its own
            if not _same_per_process(first, second, path):
                found.append({"path": path, "kind": "value", "difference": "another value of some process"})
        elif not left.stored:
            if not same_value(left.value, right.value):
                text = f"value {value_text(left.value, 30)} -> {value_text(right.value, 30)}"
                found.append({"path": path, "kind": "value", "difference": text})
        elif _stored_kind(first, left) != _stored_kind(second, right):
            what = f"{_stored_kind(first, left)} in A, {_stored_kind(second, right)} in B"
            found.append({"path": path, "kind": "kind", "difference": what})
        elif left.dtype != right.dtype:
            found.append({"path": path, "kind": "dtype", "difference": f"dtype {left.dtype} -> {right.dtype}"})
        elif left.shape != right.shape:
            found.append({"path": path, "kind": "shape", "difference": f"shape {left.shape} -> {right.shape}"})
        else:
            both.append((left, right))
    total = sum(left.nbytes + right.nbytes for left, right in both)
    with bar(total, f"comparing {first.file} and {second.file}", enabled=progress) as read:
        for left, right in both:  # one leaf at a time, so that memory holds two leaves at most
            change = compare_arrays(read_arrays(first, [left])[left.path], read_arrays(second, [right])[right.path])
            read.update(left.nbytes + right.nbytes)
            if change is not None:
                found.append({"path": left.path, "kind": "values", "difference": change})
    found.extend(structure_differences(_structure(first), _structure(second), list(a), list(b)))
    found.sort(key=lambda item: (item["path"], item["kind"] == "structure"))
    return found, len(a.keys() | b.keys())


def _same_per_process(first: Reader, second: Reader, path: str) -> bool:
    """Whether both files hold the same processes' values at ``path``, byte for byte (checksums checked)."""
    a, b = first.per_process[path], second.per_process[path]
    return a.keys() == b.keys() and all(
        np.array_equal(stored_bytes(first, path, process), stored_bytes(second, path, process)) for process in a
    )


def _structure(reader: Reader) -> Any:
    """A file's encoded structure as its header holds it (never decoded: its classes need not exist here); a plain
    file's is a flat dict of its names."""
    manifest = reader.container.manifest
    return manifest.get("structure") if manifest is not None else flat_structure(reader.paths)


def _stored_kind(reader: Reader, leaf: Leaf) -> str:
    """What a stored leaf loads as, in words: ``an array`` (sharded or not), ``a numpy scalar``, ``a torch tensor``,
    ``a threefry2x32 PRNG key``."""
    if leaf.kind == "key":
        impl = getattr(reader.stored[leaf.path], "impl", None)
        return f"a {impl} PRNG key" if impl else "a PRNG key"
    return {"npscalar": "a numpy scalar", "torch": "a torch tensor"}.get(leaf.kind, "an array")


def compare_arrays(a: np.ndarray, b: np.ndarray) -> str | None:
    """``None`` if two arrays of one dtype and shape hold the same bytes, else what differs: the values, or only their
    bytes (``-0.0`` for ``0.0``, NaNs of other payloads), which a bitwise reproduction would tell apart.

    >>> import numpy as np
    >>> from jaxstow.cli.diff import compare_arrays
    >>> compare_arrays(np.array([1.0, np.nan]), np.array([1.0, np.nan])) is None
    True
    >>> compare_arrays(np.array([0.0, 1.0]), np.array([-0.0, 1.0]))
    'the same values in other bytes: 1 of 2 elements (-0.0 for 0.0, or NaNs of other payloads)'
    >>> compare_arrays(np.array([1, 5, 3]), np.array([1, 2, 3]))
    'values differ: 1 of 3 elements, max |A - B| = 3'
    >>> compare_arrays(np.array([2**62], np.int64), np.array([2**62 + 1], np.int64))  # float64 rounds both alike
    'values differ: 1 of 1 elements, max |A - B| = 1'
    >>> compare_arrays(np.array([np.nan, 1.0]), np.array([2.0, 1001.0]))
    'values differ: 2 of 2 elements (1 a NaN against a number), max |A - B| = 1000'
    >>> compare_arrays(np.array([complex(np.nan, 1)]), np.array([complex(np.nan, 2)]))
    'values differ: 1 of 1 elements (1 a NaN against a number)'
    """
    if a.tobytes() == b.tobytes():
        return None
    if a.dtype.kind in "iub" and a.dtype == b.dtype:  # exact, in their own dtype: float64 would round beyond 2**53
        unequal = a != b
        count = int(np.count_nonzero(unequal))
        return f"values differ: {count} of {a.size} elements, max |A - B| = {_integer_gap(a[unequal], b[unequal])}"
    try:
        wide_a, wide_b = _widen(a), _widen(b)
    except (TypeError, ValueError):  # a dtype with no arithmetic: compare bytes
        return "the bytes differ"
    parts_a, parts_b = _parts(wide_a), _parts(wide_b)  # complex: each part alike, NaN or not, else it differs
    same = np.logical_and.reduce(
        [(x == y) | (np.isnan(x) & np.isnan(y)) for x, y in zip(parts_a, parts_b, strict=True)]
    )
    unequal = ~same
    count = int(np.count_nonzero(unequal))
    if count == 0:
        other = np.count_nonzero(a.reshape(-1, 1).view(np.uint8) != b.reshape(-1, 1).view(np.uint8), axis=1)
        return (
            f"the same values in other bytes: {np.count_nonzero(other)} of {a.size} elements (-0.0 for 0.0, or NaNs "
            "of other payloads)"
        )
    with_nan = unequal & (np.isnan(wide_a) | np.isnan(wide_b))  # NaN against a number: no gap to measure
    measured = unequal & ~with_nan
    text = f"values differ: {count} of {a.size} elements"
    if np.any(with_nan):
        text += f" ({int(np.count_nonzero(with_nan))} a NaN against a number)"
    if np.any(measured):
        with np.errstate(over="ignore", invalid="ignore"):  # float64's extremes: a gap beyond it is inf
            largest = float(np.max(np.abs(wide_a[measured] - wide_b[measured])))
        text += f", max |A - B| = {largest:.6g}"
    return text


def _parts(values: np.ndarray) -> tuple[np.ndarray, ...]:
    return (values.real, values.imag) if np.iscomplexobj(values) else (values,)


def _integer_gap(a: np.ndarray, b: np.ndarray) -> int:
    """The largest ``|a - b|`` of two integer (or bool) arrays of one dtype, exactly: the difference of each pair is
    taken in the unsigned integers of the same width, where it neither overflows nor wraps.

    >>> import numpy as np
    >>> _integer_gap(np.array([-(2**63)], np.int64), np.array([2**63 - 1], np.int64)) == 2**64 - 1
    True
    """
    if a.size == 0:
        return 0
    if a.dtype.kind == "b":
        return 1
    unsigned = np.dtype(f"u{a.dtype.itemsize}")
    wide_a, wide_b = a.view(unsigned), b.view(unsigned)  # two's complement: a - b mod 2**n is exact where a > b
    gap = np.where(a > b, wide_a - wide_b, wide_b - wide_a)
    return int(gap.max())


def _widen(array: np.ndarray) -> np.ndarray:
    """An array as float64 or complex128, for differences that neither overflow nor wrap around."""
    if np.issubdtype(array.dtype, np.complexfloating):
        return array.astype(np.complex128)
    return array.astype(np.float64)
