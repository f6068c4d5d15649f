"""``jaxstow verify FILE|FOLDER``: every checksum of a file, or of every step of a checkpoint folder; the structure
of a Hugging Face folder of safetensors files (every shard's header and sizes, the index against the shards), whose
files carry no checksums.

Exit status 1, with the file and leaf named, on any damage; 0 when every leaf matches its checksum.

>>> import os, tempfile, jax.numpy as jnp, jaxstow
>>> from jaxstow.cli import main
>>> path = os.path.join(tempfile.mkdtemp(), "model.jxs")
>>> jaxstow.save(path, {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)})
>>> main(["verify", path])
ok       /.../model.jxs: 2 checksums, 36 B read
1 file intact
0
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass, field

from jaxstow._format.native_or_npz import Container
from jaxstow._format.source import ReadSource
from jaxstow._read.foreign import pointed, recognise
from jaxstow._read.reader import Reader
from jaxstow._read.sharded_folder import Budget, Listing, child, open_shard, tensor_files, unmapped
from jaxstow._storage.settings import StorageSettings
from jaxstow._util.progress import bar, format_bytes
from jaxstow.checkpoint.recovery import is_damage
from jaxstow.checkpoint.step_folder import REPLACED_READS
from jaxstow.cli.files import (
    LISTINGS,
    DamagedStep,
    Step,
    committed_steps,
    describe,
    hf_listing,
    is_folder,
    open_file,
    storage,
    verify_checksums,
)
from jaxstow.cli.output import print_json, printable
from jaxstow.errors import (
    CheckpointError,
    CorruptFileError,
    FormatError,
    JaxstowError,
    NewerFormatError,
    PathNotFoundError,
    RefusedNameError,
    StepNotFoundError,
    UnknownNameError,
)

__all__ = ["HELP", "FileReport", "arguments", "run", "verify_file", "verify_hf_folder", "verify_step"]

#: What a Hugging Face folder's report says of its files: they carry no checksums, so only their structure was checked.
NO_CHECKSUMS = "structure only: safetensors files carry no checksums, so their data could not be checked"


#: The line of ``jaxstow --help`` that names this command.
HELP = "check every checksum of a file or of every step of a checkpoint folder, or a Hugging Face folder's structure"


def arguments(parser: argparse.ArgumentParser) -> None:
    """Read every stored leaf of a file (or of every item of every step of a checkpoint folder) and compare it with the
    checksum recorded when it was written. Of a Hugging Face folder of safetensors files, which carry no checksums,
    check the structure: every shard's header and sizes, and that every tensor the index names is in the shard it names.
    Exit status 1, naming the file and the leaf, on any damage; 0 when all is well."""
    parser.add_argument(
        "target",
        metavar="FILE|FOLDER",
        help="a file, a checkpoint folder or a Hugging Face folder of safetensors files (a path or an fsspec URL)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON report, for scripts")
    parser.add_argument("--progress", action="store_true", help="show a progress bar of the bytes read (needs tqdm)")


@dataclass
class FileReport:
    """What verifying one file found; ``manifest`` is whether jaxstow wrote it (its header has a checksum too).

    ``structure`` is what a file without checksums (a Hugging Face folder's shard or index) was checked for.
    """

    file: str
    checksums: int = 0
    nbytes: int = 0
    manifest: bool = False
    damage: list[JaxstowError] = field(default_factory=list)
    structure: str | None = None


def _note(report: FileReport) -> str:
    """What an intact file's line adds: why it has no checksums, if it has none."""
    if report.checksums:
        return ""
    if report.manifest:
        return " (no arrays; its header's checksum matches)"
    return " (no checksums: not written by jaxstow)"


def run(args: argparse.Namespace) -> int:
    listing = hf_listing(args.target)
    if listing is not None:
        reports = verify_hf_folder(listing)
    elif is_folder(args.target):
        reports = _verified_folder(args.target, args.progress)
    else:
        reports = [verify_file(args.target, args.target, progress=args.progress)]
    damaged = [report for report in reports if report.damage]
    if args.json:
        print_json(
            {
                "intact": not damaged,
                **({"checked": NO_CHECKSUMS} if listing is not None else {}),
                "files": [
                    {
                        "file": report.file,
                        "checksums": report.checksums,
                        "bytes": report.nbytes,
                        "damage": [{"leaf": item.path, "problem": str(item)} for item in report.damage],
                    }
                    for report in reports
                ],
            }
        )
        return 1 if damaged else 0
    for report in reports:
        if not report.damage and report.structure is not None:
            print(f"ok       {printable(report.file)}: {printable(report.structure)}")
        elif not report.damage:
            note = _note(report)
            checksums = f"{report.checksums} checksum{'s' if report.checksums != 1 else ''}"
            print(f"ok       {printable(report.file)}: {checksums}, {format_bytes(report.nbytes)} read{note}")
        for item in report.damage:
            print(f"DAMAGED  {printable(str(item))}")
    files = f"{len(reports)} file{'s' if len(reports) != 1 else ''}"
    print(
        (f"{len(damaged)} of {files} damaged" if damaged else f"{files} intact")
        + (f" ({NO_CHECKSUMS})" if listing is not None else "")
    )
    return 1 if damaged else 0


def _verified_folder(folder: str, progress: bool) -> list[FileReport]:
    """The reports of every step of ``folder`` that was not deleted while it was verified (by the keep policy of a run
    saving there); where each one was, the steps it holds then, :data:`~jaxstow.cli.files.LISTINGS` times at most,
    then a :class:`~jaxstow.errors.CheckpointError` says so: never "0 files intact"."""
    for _ in range(LISTINGS):
        steps = committed_steps(folder)
        verified = [reports for step in steps if (reports := _verified(step, progress)) is not None]
        if verified:
            return [report for reports in verified for report in reports]
    raise CheckpointError(
        f"each step it held, last {steps[0].step} to {steps[-1].step}, was deleted while it was verified, {LISTINGS} "
        "times: a run saving there deletes its steps as fast as it saves them (its keep policy); run the command "
        "again, or have the run keep more steps",
        file=folder,
    )


def _verified(step: Step | DamagedStep, progress: bool) -> list[FileReport] | None:
    """:func:`verify_step`, of a step the keep policy of a run saving there may delete meanwhile: then ``None``."""
    try:
        reports = verify_step(step, progress=progress)
    except StepNotFoundError:
        return None
    deleted = isinstance(step, Step) and any(report.damage for report in reports) and step.deleted()
    return None if deleted else reports


def verify_step(step: Step | DamagedStep, *, progress: bool = False) -> list[FileReport]:
    """Verify every item file of a step of a checkpoint folder, as the manager's restore checks it first: the record
    (a damaged one is damage to the step), each file's presence and its header against the checksum the record names
    (a file that is not the one saved is damage to that file), then every leaf."""
    if isinstance(step, DamagedStep):
        return [FileReport(step.record_url, damage=[step.problem])]
    for tries in range(1, REPLACED_READS + 1):
        reports = _step_reports(step, progress=progress)
        if not any(report.damage for report in reports) or tries == REPLACED_READS:
            break
        now = step.folder.checked_record(step.step)
        if now == step.record:  # not replaced while it was read (save(step, force=True)): the damage is the step's
            break
        step = Step(now, step.folder)
    return reports


def _step_reports(step: Step, *, progress: bool) -> list[FileReport]:
    """Every item file opened (and its header checked) first, then each read: the step is read as its record was."""
    opened: dict[str, list[ReadSource] | JaxstowError] = {}
    for item in sorted(step.record.files):
        try:
            opened[item] = step.sources(item)
        except JaxstowError as error:
            if not is_damage(error):  # missing, no file, or not the file named; a storage failure ends it
                for sources in opened.values():
                    for source in sources if isinstance(sources, list) else ():
                        source.close()
                raise
            opened[item] = error
    return [
        FileReport(step.url(step.record.files[item]), damage=[sources])
        if isinstance(sources, JaxstowError)
        else verify_file(sources, step.url(step.record.files[item]), progress=progress)
        for item, sources in opened.items()
    ]


def verify_file(target: str | ReadSource | list[ReadSource], name: str, *, progress: bool = False) -> FileReport:
    """Verify one file; a damaged header counts as damage to the whole file. A file that is not one jaxstow reads
    (another format, a newer format version) is an error, not damage."""
    report = FileReport(name)
    try:
        with open_file(target) as reader:
            report.manifest = reader.container.manifest is not None
            total = sum(leaf.nbytes for leaf in describe(reader))
            with bar(total, f"verifying {name}", enabled=progress) as read:
                report.checksums, damage = verify_checksums(reader, read.update)
                report.damage.extend(damage)
            report.nbytes = read.done
            report.damage.extend(_refused_by_a_load(reader))
    except CorruptFileError as error:
        if not isinstance(target, list) and (foreign := pointed(error, target)) is not error:
            raise foreign from None  # another library's file: not damage, and verify cannot read it
        report.damage.append(error)
    except NewerFormatError:
        raise
    except FormatError as error:
        if isinstance(target, list) or recognise(target).name != "safetensors":
            raise
        report.damage.append(error)  # a safetensors file's header it cannot read (not JSON): as in a folder's shard
    return report


def _refused_by_a_load(reader: Reader) -> list[JaxstowError]:
    """What a load would refuse in the file's structure and values, though every checksum holds (a header signed
    again by hand): values the format does not hold, names the policy refuses. A name of a library this process has
    not imported is left to the load, which imports nothing either."""
    found: list[JaxstowError] = []
    checks = [functools.partial(reader.value, path) for path in reader.value_entries] + [reader.treedef]
    for check in checks:
        try:
            check()
        except RefusedNameError as error:
            found.append(error)
        except UnknownNameError:
            continue
        except FormatError as error:
            found.append(error)
    return found


def verify_hf_folder(listing: Listing) -> list[FileReport]:
    """Check a Hugging Face folder's structure: every shard's header and sizes, each tensor in the one shard the index
    names (without an index: in one shard only). A report per shard, and one for the index if there is one."""
    settings = storage(listing.folder)
    reports = [FileReport(child(listing.folder, name)) for name in listing.files]
    containers: list[Container | None] = []
    budget = Budget()
    try:
        for name, report in zip(listing.files, reports, strict=True):
            containers.append(_shard(listing, name, report, settings, budget))
        _, problems = tensor_files(listing, containers)
        for problem in unmapped(listing.index_name, listing.weight_map or {}, containers):
            next(report for report in reports if report.file == problem.file).damage.append(problem)
    finally:
        for container in containers:
            if container is not None:
                container.close()
    if listing.index_name is not None:
        index = FileReport(child(listing.folder, listing.index_name), damage=list(problems))
        index.structure = f"{len(listing.weight_map or {})} tensors, each in the shard it names"
        return [*reports, index]
    for problem in problems:
        next((report for report in reports if report.file == problem.file), reports[0]).damage.append(problem)
    return reports


def _shard(
    listing: Listing, name: str, report: FileReport, settings: StorageSettings, budget: Budget
) -> Container | None:
    """Open one shard, its header and sizes checked; ``None``, with the damage in ``report``, if that fails."""
    try:
        container = open_shard(listing, name, settings, budget)
    except NewerFormatError:
        raise
    except (FormatError, PathNotFoundError) as error:
        report.damage.append(error)
        return None
    tensors = len(container.slots)
    report.nbytes = sum(slot.nbytes for slot in container.slots.values())
    report.structure = (
        f"header and sizes, {tensors} tensor{'s' if tensors != 1 else ''} ({format_bytes(report.nbytes)})"
    )
    return container
