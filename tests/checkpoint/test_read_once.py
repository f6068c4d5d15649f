"""Where a multi-process restore reads shared boxes once: shared storage slower than the interconnect, not a local
disk; ``broadcast_restore`` forces it either way."""

from __future__ import annotations

import pytest

from jaxstow._steps.record import RECORD_NAME
from jaxstow._storage.store import open_store
from jaxstow.checkpoint.read_once import file_system, pays, pays_for_path

MOUNTS = r"""/dev/nvme0n1p1 / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw 0 0
server:/export /mnt/team\040runs nfs4 rw 0 0
bucket /mnt/bucket fuse.gcsfuse rw 0 0
mds@tcp:/scratch /lustre lustre rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "kind", "shared"),
    [
        ("/home/me/run", "ext4", False),
        ("/tmp/run", "tmpfs", False),
        ("/mnt/team runs/a", "nfs4", True),  # a mount point with a space, escaped in /proc/mounts
        ("/mnt/teamruns", "ext4", False),  # a sibling of the mount point is not inside it
        ("/mnt/bucket/run", "fuse.gcsfuse", True),
        ("/lustre/project/run", "lustre", True),
    ],
)
def test_network_file_systems_are_told_from_local_disks(path, kind, shared):
    assert file_system(path, MOUNTS) == kind
    assert pays_for_path(path, MOUNTS) is shared


def test_a_local_folder_reads_in_every_process_an_object_store_once_and_a_choice_wins(tmp_path):
    local = open_store(str(tmp_path / "run"), marker=RECORD_NAME)
    assert file_system(str(tmp_path)) != ""  # this machine's own mounts are read
    assert pays(local, None) is pays_for_path(str(tmp_path))
    bucket = open_store("s3://bucket/run", marker=RECORD_NAME, settings=None)
    memory = open_store("memory://run", marker=RECORD_NAME)
    assert pays(bucket, None) is True
    assert pays(memory, None) is False  # each process's own memory
    for store in (local, bucket, memory):
        assert pays(store, True) is True
        assert pays(store, False) is False
