"""Fixtures of the writing tests."""

from __future__ import annotations

import pytest

from jaxstow._util import pinned
from jaxstow._write import host_budget


@pytest.fixture(params=["pageable", "pinned_host"])
def as_if_on_an_accelerator(request, monkeypatch):
    """CPU jax arrays taken down the path of accelerator arrays: brought to the host by the budget, through the
    device's ``pinned_host`` memory as on a GPU (CPU devices have it), or by ``copy_to_host_async``."""
    monkeypatch.setattr(host_budget, "_HOST_PLATFORMS", frozenset())
    monkeypatch.setattr(host_budget, "_accelerators_present", lambda: True)
    if request.param == "pinned_host":
        monkeypatch.setattr(pinned, "PINNED_PLATFORMS", pinned.PINNED_PLATFORMS | {"cpu"})
    return request.param
