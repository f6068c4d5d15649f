"""A FlareJax module holding a container FlareJax cannot rebuild (an OrderedDict, a defaultdict, a namedtuple) is
refused when saved, naming it: it saved, and no load could rebuild it. What FlareJax rebuilds saves and loads."""

from __future__ import annotations

import collections
import io

import jax.numpy as jnp
import pytest

import jaxstow
from jaxstow.errors import UnsaveableObjectError

flr = pytest.importorskip("flarejax")


@jaxstow.saveable(name="tests.flarejax_containers.Holder")
class Holder(flr.Module):
    def __init__(self, **attributes):
        self.w = jnp.ones(2)
        for name, value in attributes.items():
            setattr(self, name, value)


Shape = jaxstow.saveable(collections.namedtuple("Shape", "h w"), name="tests.flarejax_containers.Shape")


@pytest.mark.parametrize(
    "held",
    [collections.OrderedDict(a=1), collections.defaultdict(list, a=[1]), Shape(3, 4)],
    ids=["OrderedDict", "defaultdict", "namedtuple"],
)
def test_a_module_holding_a_container_flarejax_cannot_rebuild_is_refused_when_saved(held):
    buffer = io.BytesIO()
    with pytest.raises(
        UnsaveableObjectError, match=r"(?s)cannot save leaf 'model/1' of <BytesIO>: .* FlareJax cannot rebuild"
    ):
        jaxstow.save(buffer, {"model": [0, Holder(config=held)]})
    assert buffer.getvalue() == b""


def test_a_module_holding_what_flarejax_rebuilds_saves_and_loads():
    buffer = io.BytesIO()
    jaxstow.save(buffer, {"model": Holder(config={"a": (1, [2.5])}, inner=Holder(depth=2))})
    buffer.seek(0)
    model = jaxstow.load(buffer)["model"]
    assert model.config == {"a": (1, [2.5])} and model.inner.depth == 2 and model.w.tolist() == [1.0, 1.0]
