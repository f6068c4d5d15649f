"""The README's examples of saving and restoring run as written, in a fresh folder (4 CPU devices: conftest)."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow._names import registry

README = Path(__file__).parents[1] / "README.md"


# Other tests and doctests register the README's activation too; registering it again is what a reader does.
@pytest.mark.filterwarnings("ignore:jaxstow.saveable. the name 'my_project.swish'")
def test_the_saving_and_restoring_examples_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    monkeypatch.chdir(tmp_path)
    for table in ("_registered", "_registered_names"):  # what the README registers is forgotten afterwards
        monkeypatch.setattr(registry, table, dict(getattr(registry, table)))
    names: dict = {}
    for block in blocks[:2]:  # "Saving and loading", then "Restoring anything onto anything"
        exec(compile(block, str(README), "exec"), names)
    assert names["model16"].layers[0].weight.dtype == jnp.bfloat16
    assert names["model"].activation is names["swish"]
    assert set(names["params"]) == {"params"} and set(names["params"]["params"]) == {"encoder", "decoder"}
    assert set(names["encoder"]["params"]) == {"encoder"}
    assert names["tree"]["params"]["encoder"]["w"].sharding == names["rows"]
    np.testing.assert_array_equal(names["tree"]["params"]["encoder"]["w"], np.ones((8, 4), np.float32))
    assert isinstance(names["tree"]["params"]["decoder"]["w"], jax.Array) and names["tree"]["step"] == 7
