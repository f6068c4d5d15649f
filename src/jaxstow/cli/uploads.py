"""``jaxstow uploads URL``: the unfinished multipart uploads under an ``s3://`` prefix, and ``--abort`` to end them.

A process killed mid-save leaves an unfinished upload (its parts stored, and billed, but no object). The next save
to the same key, and a checkpoint manager taking over its directory, abort such uploads themselves; this command
finds those left anywhere else. ``--older-than SECONDS`` spares uploads still being written. ``s3://bucket/run`` names
the file ``run`` and the folder ``run/`` (never ``run2/``); ``s3://bucket/run/`` the folder alone.

Exit status 0; 2 on an error (a URL that is not ``s3://``, a server out of reach, an upload still listed after
``--abort``).
"""

from __future__ import annotations

import argparse
import datetime
import math
from typing import Any

from jaxstow.cli.files import storage
from jaxstow.cli.output import Table, print_json
from jaxstow.errors import ArgumentError, StorageError, excerpt

__all__ = ["HELP", "arguments", "run"]


#: The line of ``jaxstow --help`` that names this command.
HELP = "unfinished multipart uploads under an s3:// prefix (what killed saves left); --abort ends them"


def arguments(parser: argparse.ArgumentParser) -> None:
    """List the multipart uploads under an s3:// prefix that were neither completed nor aborted: processes killed while
    saving leave them (their parts take space; no object appears). --abort aborts them; an upload still being written
    looks the same, so --older-than spares the recent ones."""
    parser.add_argument("url", metavar="URL", help="an s3:// prefix: a bucket, a folder or a file")
    parser.add_argument("--abort", action="store_true", help="abort the uploads listed")
    parser.add_argument(
        "--older-than", type=_age, default=0.0, metavar="SECONDS", help="only uploads started this long ago or more"
    )
    parser.add_argument("--json", action="store_true", help="print the uploads as JSON, for scripts")


def _age(text: str) -> float:
    """``--older-than``: a number of seconds, 0 or more (NaN matched no upload, and none was aborted)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is no number of seconds, 0 or more")
    return seconds


def _under(key: str, prefix: str, *, folder: bool) -> bool:
    """Whether ``key`` lies in the folder ``prefix`` names (not in a sibling, ``run2/``) or, unless the URL named a
    ``folder`` (it ended in ``/``), is the file ``prefix`` names."""
    return not prefix or key.startswith(prefix.rstrip("/") + "/") or (key == prefix and not folder)


def run(args: argparse.Namespace) -> int:
    from jaxstow._storage.remote import url_filesystem
    from jaxstow._storage.s3 import S3Bucket, is_s3

    settings = storage()
    fs, path = url_filesystem(args.url, settings.options)
    if not is_s3(fs):
        raise ArgumentError(f"{args.url}: only s3:// stores have multipart uploads to list")
    bucket_name, prefix, _ = fs.split_path(path)
    if not bucket_name:
        raise ArgumentError(f"{args.url}: names no bucket: give s3://BUCKET or s3://BUCKET/PREFIX")
    bucket = S3Bucket(fs, bucket_name, settings.transfer)
    now = datetime.datetime.now(datetime.UTC)
    found = [
        upload
        for upload in bucket.unfinished_uploads(prefix, url=args.url)
        if _under(upload["Key"], prefix, folder=args.url.endswith("/"))
        and (now - upload["Initiated"]).total_seconds() >= args.older_than
    ]
    left: list[dict[str, Any]] = []
    if args.abort:
        bucket.abort_uploads(found, url=args.url)
        listed = {upload["UploadId"] for upload in bucket.unfinished_uploads(prefix, url=args.url)}
        left = [upload for upload in found if upload["UploadId"] in listed]
        found = [upload for upload in found if upload["UploadId"] not in listed]
    rows = [
        {
            "key": f"s3://{bucket_name}/{upload['Key']}",
            "upload_id": upload["UploadId"],
            "started": upload["Initiated"].isoformat(timespec="seconds"),
            "age_seconds": round((now - upload["Initiated"]).total_seconds()),
        }
        for upload in found
    ]
    done = "aborted" if args.abort else "unfinished"
    if args.json:
        print_json({"url": args.url, done: rows})
    else:
        if rows:
            table = Table(["key", "started", "age", "upload id"], right=["age"])
            for row in rows:
                table.add(row["key"], row["started"], f"{row['age_seconds']} s", row["upload_id"])
            table.show()
        print(f"{len(rows)} upload{'s' if len(rows) != 1 else ''} {done} under {args.url}")
    if left:
        raise StorageError(_not_aborted(left, bucket_name), file=args.url)
    return 0


def _not_aborted(left: list[dict[str, Any]], bucket_name: str) -> str:
    """Why the uploads ``left`` are still listed after they were aborted, and how to end them."""
    shown = ", ".join(f"{excerpt('s3://' + bucket_name + '/' + up['Key'])} (upload id {up['UploadId']})" for up in left)
    return (
        f"{len(left)} upload{'s' if len(left) != 1 else ''} still unfinished after aborting: {shown}: the server "
        "lists the key otherwise than it was written (a character its listing cannot carry), so the abort reached no "
        "upload; end it by its upload id with the store's own tools, or with a lifecycle rule "
        "(AbortIncompleteMultipartUpload)"
    )
