"""``torch.Tensor`` leaves at the edges: lazy conjugate and negative views, float8 dtypes, tensors with no plain array
of values, and tensors read from a memory-mapped file."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import jaxstow
from jaxstow._format.torch_leaves import tensor_to_numpy
from jaxstow.errors import UnsaveableObjectError

torch = pytest.importorskip("torch")

_FLOAT8 = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"]


def _round_trip(tree):
    buffer = io.BytesIO()
    jaxstow.save(buffer, tree)
    buffer.seek(0)
    return jaxstow.load(buffer)


def test_conjugate_and_negative_views_save_the_values_they_show():
    complex_values = torch.tensor([1 + 2j, -3 - 4j])
    tree = {"conj": complex_values.conj(), "neg": complex_values.conj().imag, "plain": complex_values}
    assert tree["conj"].is_conj() and tree["neg"].is_neg()
    restored = _round_trip(tree)
    for path, tensor in tree.items():
        assert not restored[path].is_conj() and not restored[path].is_neg()
        assert restored[path].dtype == tensor.dtype
        assert torch.equal(restored[path], tensor.resolve_conj().resolve_neg()), path
    assert restored["neg"].tolist() == [-2.0, 4.0]


@pytest.mark.parametrize("name", [name for name in _FLOAT8 if hasattr(torch, name) and hasattr(ml_dtypes, name)])
def test_float8_tensors_save_and_load_as_themselves(name, tmp_path):
    dtype = getattr(torch, name)
    tensor = torch.tensor([0.5, 2.0, 4.0, 0.25]).to(dtype)
    jaxstow.save(tmp_path / "f8.jxs", {"t": tensor, "scalar": tensor[1]})
    restored = jaxstow.load(tmp_path / "f8.jxs")
    assert restored["t"].dtype == dtype and torch.equal(restored["t"].view(torch.uint8), tensor.view(torch.uint8))
    assert restored["scalar"].shape == torch.Size([]) and float(restored["scalar"]) == 2.0
    with jaxstow.open(tmp_path / "f8.jxs") as reader:
        stored = reader.read("t")
    assert stored.dtype == np.dtype(getattr(ml_dtypes, name))
    assert stored.astype(np.float32).tolist() == [0.5, 2.0, 4.0, 0.25]
    into = jaxstow.load(tmp_path / "f8.jxs", like={"t": torch.zeros(4, dtype=dtype), "scalar": tensor[0]})
    assert into["t"].dtype == dtype and torch.equal(into["t"].float(), tensor.float())


def _refused():
    dense = torch.ones(2, 2)
    return {
        "sparse": (dense.to_sparse(), r"layout torch\.sparse_coo.*save tensor\.to_dense\(\)"),
        "csr": (dense.to_sparse_csr(), r"layout torch\.sparse_csr.*save tensor\.to_dense\(\)"),
        "quantized": (
            torch.quantize_per_tensor(dense, 0.1, 0, torch.quint8),
            r"a quantized tensor: save tensor\.dequantize\(\)",
        ),
        "meta": (torch.empty(2, device="meta"), r"on the meta device, which holds no values: materialize it"),
        "complex32": (torch.ones(2, dtype=torch.complex32), r"dtype torch\.complex32.*tensor\.to\(torch\.complex64\)"),
        "nested": (torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), r"a nested tensor.*tensor\.unbind\(\)"),
    }


@pytest.mark.parametrize("kind", list(_refused()))
def test_tensors_without_a_plain_array_of_values_are_refused_with_what_to_save(kind):
    tensor, advice = _refused()[kind]
    with pytest.raises(UnsaveableObjectError, match=advice):
        jaxstow.save(io.BytesIO(), {"layer": {"w": tensor}})
    with pytest.raises(
        UnsaveableObjectError, match=f"(?s)^cannot save leaf 'layer/w' of model.jxs: .*{advice}"
    ) as caught:
        tensor_to_numpy(tensor, file="model.jxs", path="layer/w")
    assert caught.value.path == "layer/w" and caught.value.file == "model.jxs"


def test_a_tensor_from_a_memory_mapped_file_can_be_written(tmp_path):
    path = tmp_path / "t.jxs"
    jaxstow.save(path, {"t": torch.ones(4)})
    script = textwrap.dedent(
        f"""
        import torch, jaxstow
        with jaxstow.open({str(path)!r}, mmap=True) as reader:
            tensor = reader["t"]
            tensor[0] = 5.0
            print(tensor.tolist())
        print(jaxstow.load({str(path)!r})["t"].tolist())
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.splitlines() == ["[5.0, 1.0, 1.0, 1.0]", "[1.0, 1.0, 1.0, 1.0]"]


@pytest.mark.parametrize("options", [{}, {"select": "weight"}, {"pipeline": True}], ids=["whole", "select", "pipeline"])
def test_as_numpy_gives_torch_leaves_as_numpy_with_or_without_like(tmp_path, options):
    path = tmp_path / "state.jxs"
    jaxstow.save(path, {"weight": torch.arange(6.0).reshape(2, 3), "half": torch.ones(2, dtype=torch.bfloat16)})
    loaded = jaxstow.load(path, as_numpy=True, **options)
    fitted = jaxstow.load(path, like={"weight": torch.zeros(2, 3), "half": torch.zeros(2, dtype=torch.bfloat16)})
    for name, value in loaded.items():
        assert type(value) is np.ndarray, (name, type(value))
        assert value.tobytes() == tensor_to_numpy(fitted[name]).tobytes()
    assert loaded["weight"].dtype == np.float32 and loaded["weight"].shape == (2, 3)
    assert isinstance(jaxstow.load(path)["weight"], torch.Tensor)  # without as_numpy: the tensors saved
