"""Permission bits that bind root too: a child process that gives up the capabilities with which root ignores them.

Permission bits do not stop root, so a test that makes a folder read-only and runs as root passes this as the child's
``preexec_fn``: the child drops ``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH`` and ``CAP_FOWNER`` from its bounding set
with ``prctl(PR_CAPBSET_DROP)`` before ``exec``, and stays the owner of its folder, as an ordinary user would be.
"""

from __future__ import annotations

import ctypes
import os
import subprocess

import pytest

_PR_CAPBSET_DROP = 24
_PERMISSION_OVERRIDES = (1, 2, 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


def obey_permission_bits() -> None:
    """In the child before exec: drop the capabilities with which root ignores permission bits."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in _PERMISSION_OVERRIDES:
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {capability}) failed")


def run_obeying_permission_bits(*command: str) -> subprocess.CompletedProcess[str]:
    """``command`` run to its end by a child that obeys permission bits (root's child gives up its overrides), its
    output captured as text; the test skipped where root may not give them up."""
    try:
        return subprocess.run(
            command, capture_output=True, text=True, preexec_fn=obey_permission_bits if os.geteuid() == 0 else None
        )
    except subprocess.SubprocessError as error:  # raised when preexec_fn fails
        pytest.skip(f"running as root without the right to drop CAP_DAC_OVERRIDE, so chmod stops nothing: {error}")
