"""``jaxstow export STEP_OR_FILE OUT_FOLDER``: a checkpoint step or a file as a Hugging Face sharded safetensors folder.

A step saved by any number of processes is written whole: each sharded array joined from its shards. See
:func:`jaxstow.export_safetensors` and docs/command-line.md.

>>> import os, tempfile, jax.numpy as jnp, jaxstow
>>> from jaxstow.cli import main
>>> folder = tempfile.mkdtemp()
>>> jaxstow.save(os.path.join(folder, "w.jxs"), {"w": jnp.ones((2, 3))})
>>> main(["export", os.path.join(folder, "w.jxs"), os.path.join(folder, "hf")])
/.../w.jxs -> /.../hf: 1 tensor, 24 B in 1 file
0
"""

from __future__ import annotations

import argparse

from jaxstow._util.progress import format_bytes
from jaxstow.checkpoint.hf_export import export_safetensors
from jaxstow.cli.files import storage

__all__ = ["HELP", "arguments", "run"]


#: The line of ``jaxstow --help`` that names this command.
HELP = "a checkpoint step or a file as a Hugging Face sharded safetensors folder"


def arguments(parser: argparse.ArgumentParser) -> None:
    """Write STEP_OR_FILE as a Hugging Face sharded safetensors folder OUT_FOLDER: files model-00001-of-0000N.safetensors
    of at most --max-shard-size bytes of tensors, each with {'format': 'pt'} in its metadata, and
    model.safetensors.index.json. STEP_OR_FILE: a step of a checkpoint folder (run/5), saved by any number of processes
    (sharded arrays are joined whole), or a jaxstow, safetensors or npz file. Tensors are named by their dotted paths
    (params/dense/kernel -> params.dense.kernel), prefixed by their item's name when the step has several; plain values
    and PRNG keys are left out. No config.json is written: copy the model's own next to the files for the transformers
    library."""
    parser.add_argument("src", metavar="STEP_OR_FILE", help="a step's folder or a file (a path or an fsspec URL)")
    parser.add_argument("dst", metavar="OUT_FOLDER", help="the folder to write; it must not exist, or be empty")
    parser.add_argument(
        "--max-shard-size",
        default="5GB",
        metavar="SIZE",
        help="the most bytes of tensors per file: 5GB (5*10**9, the default), 500MB, 2GiB or a number of bytes",
    )
    parser.add_argument("--item", metavar="NAME", help="export only this item of the step (its names unprefixed)")
    parser.add_argument("--progress", action="store_true", help="show a progress bar of the bytes written (needs tqdm)")


def run(args: argparse.Namespace) -> int:
    size = int(args.max_shard_size) if args.max_shard_size.isdigit() else args.max_shard_size
    settings = storage()
    exported = export_safetensors(
        args.src,
        args.dst,
        max_shard_size=size,
        item=args.item,
        storage_options=settings.options,
        transfer=settings.transfer,
        progress=args.progress,
    )
    files = len(exported.files)
    print(
        f"{args.src} -> {args.dst}: {exported.tensors} tensor{'s' * (exported.tensors != 1)}, "
        f"{format_bytes(exported.total_size)} in {files} file{'s' * (files != 1)}"
        + (f" (left out: {', '.join(exported.left_out)})" if exported.left_out else "")
    )
    return 0
