"""ArviZ: the samples of every chain, from results, a MemoryCollector or an HDF5Collector's file, as InferenceData
(ArviZ 0.x) or a DataTree (ArviZ 1.x); the tests of one major skip at the other."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import ArgumentError, CollectorError, JaxstowError, MissingDependencyError

if importlib.util.find_spec("arviz") is None:
    pytest.skip("needs ArviZ (pip install 'jaxstow[arviz]')", allow_module_level=True)
ARVIZ = importlib.metadata.version("arviz")
ARVIZ_1 = int(ARVIZ.split(".")[0]) >= 1
only_arviz_0 = pytest.mark.skipif(ARVIZ_1, reason=f"ArviZ {ARVIZ} holds a run in a DataTree, not InferenceData")
only_arviz_1 = pytest.mark.skipif(not ARVIZ_1, reason=f"ArviZ {ARVIZ} is 0.x")


@pytest.fixture
def az():
    """ArviZ, imported by the tests that call it, not while the suite is collected (it imports matplotlib)."""
    import arviz

    return arviz


CHAINS, STEPS = 3, 40


def _run(collector, keep_every=(1, 1, 1)):
    """CHAINS chains under vmap; chain c keeps every keep_every[c]-th step; sample = offset + step."""
    init_save, save, postprocess_save = io.save(collector, block_size=8)
    sample = {"theta": jnp.zeros(2), "layer": {"bias": jnp.float32(0.0)}}
    states = [init_save(sample, None, io.scheduler.static_information(samples_collected=None)) for _ in range(CHAINS)]
    states = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)

    def chain(state, offset, every):
        def step(state, i):
            value = offset + i.astype(jnp.float32)
            return save(state, i % every == 0, {"theta": jnp.stack([value, -value]), "layer": {"bias": value}})

        return jax.lax.scan(step, state, jnp.arange(STEPS))[0]

    offsets = 1000.0 * jnp.arange(CHAINS)
    return postprocess_save(jax.jit(jax.vmap(chain))(states, offsets, jnp.array(keep_every)), None)


def _expected_theta():
    return np.stack([np.stack([1000.0 * c + np.arange(STEPS), -(1000.0 * c + np.arange(STEPS))], -1) for c in range(3)])


def test_all_chains_of_postprocess_save_become_chain_and_draw():
    collector = io.MemoryCollector()
    results = _run(collector)
    idata = io.to_inference_data(results)
    assert dict(idata.posterior.sizes) == {"chain": 3, "draw": STEPS, "theta_dim_0": 2}
    np.testing.assert_array_equal(idata.posterior["theta"].values, _expected_theta())
    np.testing.assert_array_equal(idata.posterior["layer.bias"].values, _expected_theta()[..., 0])
    from_collector = io.to_inference_data(collector)  # the samples the results hold
    np.testing.assert_array_equal(from_collector.posterior["theta"].values, _expected_theta())


def test_the_rows_past_a_chains_sample_count_are_no_draws():
    padded = [{"sample_count": 2, "samples": {"x": np.array([1.0, 2.0, 0.0, 0.0])}}]  # storage for 4, 2 kept
    idata = io.to_inference_data(padded)  # the padding rows were two more draws
    assert idata.posterior.sizes["draw"] == 2 and idata.posterior["x"].values.tolist() == [[1.0, 2.0]]
    with pytest.raises(JaxstowError, match="chain 0 has sample_count 5, but 2 rows of samples"):
        io.to_inference_data({"sample_count": 5, "samples": {"x": np.array([1.0, 2.0])}})


def test_a_collector_whose_samples_were_dropped_says_what_to_pass_instead():
    collector = io.MemoryCollector()
    _run(collector)  # the results are dropped: the collector keeps nothing of a run that ended
    with pytest.raises(CollectorError, match="pass what postprocess_save returns to to_inference_data"):
        io.to_inference_data(collector)


def test_one_chain_is_one_chain_not_hundreds():
    results = _run(io.MemoryCollector())
    idata = io.to_inference_data(results[1])
    assert (idata.posterior.sizes["chain"], idata.posterior.sizes["draw"]) == (1, STEPS)
    np.testing.assert_array_equal(idata.posterior["theta"].values[0], _expected_theta()[1])


def test_an_hdf5_collectors_file_by_path_or_open(tmp_path, az):
    path = tmp_path / "samples.h5"
    with h5py.File(path, "w") as file:
        _run(io.HDF5Collector(file))
        opened = io.to_inference_data(file)
    by_path = io.to_inference_data(path)
    for idata in (opened, by_path):
        assert idata.posterior.sizes["chain"] == 3
        np.testing.assert_array_equal(idata.posterior["theta"].values, _expected_theta())
    summary = az.summary(by_path, var_names=["layer.bias"])
    np.testing.assert_allclose(summary["mean"].iloc[0], np.mean(_expected_theta()[..., 0]), rtol=1e-6)
    assert {"mean", "sd", "r_hat", "ess_bulk"} <= set(summary.columns)


def _runs(collector, chains, deleted=None):
    """A run of each number of ``chains`` in turn (chain ``c``'s draws are ``10 c, 10 c + 1, 10 c + 2``), the file
    ``deleted`` after the first run, so that the later runs' chains alone are in it; the last run's results."""
    init_save, save, postprocess_save = io.save(collector)
    step = jax.jit(lambda state, t: save(state, True, {"x": 10.0 * state.chain_id + t})[0])
    for run, count in enumerate(chains):
        if run == 1 and deleted is not None:
            deleted.unlink()
        states = [init_save({"x": 0.0}, None, scheduler.static_information(samples_collected=3)) for _ in range(count)]
        for t in range(3):
            states = [step(state, float(t)) for state in states]
        results = [postprocess_save(state, None) for state in states]
    return results


def test_the_chain_coordinate_holds_the_ids_of_the_chains_not_their_positions(tmp_path, az):
    path = tmp_path / "samples.h5"
    _runs(io.HDF5Collector(path), (1, 2), deleted=path)  # the file holds /chain~1 and /chain~2 alone
    memory = io.MemoryCollector()
    held = _runs(memory, (1, 2))  # the first run's samples dropped: it gives chains 1 and 2
    for source in (path, memory):
        posterior = io.to_inference_data(source).posterior
        assert posterior["chain"].values.tolist() == [1, 2]  # they were 0 and 1, the draws of chain 1 at chain 0
        assert posterior["x"].sel(chain=2).values.tolist() == [20.0, 21.0, 22.0]
        assert {"r_hat", "ess_bulk"} <= set(az.summary(io.to_inference_data(source)).columns)
        relabelled = io.to_inference_data(source, coords={"chain": ["b", "c"]}).posterior
        assert relabelled["chain"].values.tolist() == ["b", "c"]
    assert io.to_inference_data(held).posterior["chain"].values.tolist() == [0, 1]  # a list: its positions
    with pytest.raises(ArgumentError, match=r"coords\['chain'\] is \[1\], but the dimension 'chain' is the 2 chains"):
        io.to_inference_data(path, coords={"chain": [1]})


def test_chains_numbered_from_0_are_labelled_as_arviz_labels_them(tmp_path, az):
    import xarray

    from jaxstow.io.arviz_data import from_posterior

    path = tmp_path / "samples.h5"
    _run(io.HDF5Collector(path))
    posterior = io.to_inference_data(path, dims={"theta": ["sign"]}).posterior
    arrays = {name: posterior[name].values for name in ("theta", "layer.bias")}
    before = from_posterior(arrays, purpose="a test", dims={"theta": ["sign"]}).posterior  # no chain coordinate given
    xarray.testing.assert_equal(
        posterior.to_dataset() if ARVIZ_1 else posterior, before.to_dataset() if ARVIZ_1 else before
    )
    assert posterior["chain"].dtype == before["chain"].dtype and posterior["chain"].values.tolist() == [0, 1, 2]


def test_a_mismatch_names_the_chains_by_their_ids(tmp_path):
    path = tmp_path / "samples.h5"
    init_save, save, postprocess_save = io.save(io.HDF5Collector(path))
    for run, width in enumerate((3, 5, 7)):  # the file deleted after the first run: it holds chains 1 and 2
        if run == 1:
            path.unlink()
        state = init_save({"w": jnp.zeros(width)}, None, scheduler.static_information(samples_collected=1))
        postprocess_save(save(state, True, {"w": jnp.ones(width)})[0], None)
    with pytest.raises(JaxstowError, match=r"'w' has a draw of shape \(5,\) in chain 1 but \(7,\) in chain 2"):
        io.to_inference_data(path)


def test_results_whose_hdf5_file_was_closed_say_to_pass_the_path(tmp_path, az):
    path = tmp_path / "samples.h5"
    with h5py.File(path, "w") as file:
        results = _run(io.HDF5Collector(file))  # their samples are the file's datasets
    with pytest.raises(CollectorError, match=r"an HDF5 file that was closed since .*pass the file's path"):
        io.to_inference_data(results)
    assert io.to_inference_data(path).posterior.sizes["chain"] == 3


def test_chains_of_different_lengths_need_truncate():
    results = _run(io.MemoryCollector(), keep_every=(1, 2, 4))
    with pytest.raises(JaxstowError, match=r"different numbers of samples \(\[40, 20, 10\]\).*truncate=True"):
        io.to_inference_data(results)
    idata = io.to_inference_data(results, truncate=True, dims={"theta": ["sign"]}, coords={"sign": ["+", "-"]})
    assert dict(idata.posterior.sizes) == {"chain": 3, "draw": 10, "sign": 2}
    np.testing.assert_array_equal(idata.posterior["theta"].values[2, :, 0], 2000.0 + 4 * np.arange(10))


def test_runs_whose_draws_differ_in_shape_name_the_variable_and_both_shapes(tmp_path):
    collector = io.HDF5Collector(tmp_path / "samples.h5")
    init_save, save, postprocess_save = io.save(collector)
    for width in (5, 7):  # one strategy, two runs of other shapes: each run its own chains of the file
        state = init_save({"w": jnp.zeros(width)}, None, scheduler.static_information(samples_collected=3))
        for _ in range(3):
            state, _ = save(state, True, {"w": jnp.ones(width)})
        postprocess_save(state, None)
    with pytest.raises(JaxstowError, match=r"'w' has a draw of shape \(5,\) in chain 0 but \(7,\) in chain 1"):
        io.to_inference_data(tmp_path / "samples.h5")


def test_a_file_holding_a_failed_runs_chains_beside_a_finished_runs_is_refused_not_cut_short(tmp_path):
    # The failed run's chains, left unended, turned truncation on: the finished chains were cut to their 4 draws, and
    # the failed run's draws mixed in, without a word.
    path = tmp_path / "samples.h5"
    collector = io.HDF5Collector(path)
    init_save, save, postprocess_save = io.save(collector, block_size=2)
    information = scheduler.static_information(samples_collected=None)
    step = jax.jit(jax.vmap(lambda state, x: save(state, True, {"x": x})[0]))
    states = jax.vmap(lambda _: init_save({"x": jnp.zeros(())}, None, information))(jnp.arange(2))
    for i in range(5):  # a run that fails in the user's code after 5 steps: postprocess_save is never called
        states = step(states, jnp.full(2, -100.0 - i))
    states = jax.vmap(lambda _: init_save({"x": jnp.zeros(())}, None, information))(jnp.arange(2))
    for i in range(7):
        states = step(states, jnp.full(2, float(i)))
    finished = postprocess_save(states, None)
    collector.close()  # the failed run's chains kept the file open
    with pytest.raises(
        JaxstowError,
        match=r"chains 0 \(4 draws\), 1 \(4 draws\) of .*samples.h5 are of a run that "
        r"has not ended .* chains 2 \(7\), 3 \(7\) of one that ended",
    ):
        io.to_inference_data(path)
    np.testing.assert_array_equal(io.to_inference_data(finished).posterior["x"].values, [np.arange(7.0)] * 2)
    everything = io.to_inference_data(path, truncate=True)  # asked for: every chain, cut to the shortest
    assert everything.posterior["chain"].values.tolist() == [0, 1, 2, 3]
    assert dict(everything.posterior.sizes)["draw"] == 4


def test_files_and_objects_that_hold_no_samples(tmp_path):
    with h5py.File(tmp_path / "other.h5", "w") as file:
        file["x"] = np.ones(3)
    with pytest.raises(JaxstowError, match=r"other.h5: holds no /chain~\{id\} group"):
        io.to_inference_data(tmp_path / "other.h5")
    with h5py.File(tmp_path / "unfinished.h5", "w") as file:
        file["chain~0/theta"] = np.ones((3, 2))
    with pytest.raises(JaxstowError, match="chain 0 has no sample_count: its run did not finish"):
        io.to_inference_data(tmp_path / "unfinished.h5")
    with pytest.raises(TypeError, match="not ndarray"):
        io.to_inference_data(np.ones((4, 100)))


@only_arviz_0
def test_arviz_0_gets_inference_data_and_its_datatree(az):
    results = _run(io.MemoryCollector())
    idata = io.to_inference_data(results)
    assert isinstance(idata, az.InferenceData)
    tree = io.to_datatree(results, dims={"theta": ["sign"]}, coords={"sign": ["+", "-"]})
    assert type(tree).__name__ == "DataTree" and list(tree.children) == ["posterior"]
    assert dict(tree["posterior"].sizes) == {"chain": 3, "draw": STEPS, "sign": 2}
    np.testing.assert_array_equal(tree["posterior"]["theta"].values, _expected_theta())


def _no_xarray_datatree(self):
    raise ImportError("xarray must be have DataTree in order to use InferenceData.to_datatree")


@only_arviz_0
@pytest.mark.parametrize("older", ["no conversion", "an xarray without DataTree", "the datatree package's"])
def test_an_arviz_0_without_xarrays_datatree_is_named_with_what_to_install(monkeypatch, older, az):
    if older == "no conversion":
        monkeypatch.delattr(az.InferenceData, "to_datatree")
    elif older == "an xarray without DataTree":
        monkeypatch.setattr(az.InferenceData, "to_datatree", _no_xarray_datatree)
    else:
        monkeypatch.setattr(az.InferenceData, "to_datatree", lambda self: {"posterior": self.posterior})
    with pytest.raises(MissingDependencyError, match=r"ArviZ 0\..*pip install --upgrade arviz 'xarray>=2024.11'"):
        io.to_datatree(_run(io.MemoryCollector()))


@only_arviz_1
def test_arviz_1_gets_a_datatree_its_functions_take(az):
    import xarray

    results = _run(io.MemoryCollector())
    data = io.to_inference_data(results, dims={"theta": ["sign"]}, coords={"sign": ["+", "-"]})
    assert isinstance(data, xarray.DataTree)
    assert dict(data.posterior.sizes) == {"chain": 3, "draw": STEPS, "sign": 2}
    np.testing.assert_array_equal(data.posterior["theta"].values, _expected_theta())
    assert list(data.posterior["theta"].coords["sign"].values) == ["+", "-"]
    tree = io.to_datatree(results)
    assert isinstance(tree, xarray.DataTree)
    np.testing.assert_array_equal(tree.posterior["layer.bias"].values, _expected_theta()[..., 0])
    rhat = az.rhat(tree)
    assert rhat["theta"].values.shape == (2,) and float(rhat["theta"].values[0]) > 2  # chains 1000 apart


def test_a_variable_named_with_a_slash_reaches_the_datatree_at_either_major(az):
    """numpyro's ``handlers.scope`` names its sites ``scope/name``: a DataTree's variables may not hold a ``/``."""
    tree = io.to_datatree({"sample_count": 4, "samples": {"grp/s": np.arange(4.0), "theta": np.ones(4)}})
    assert sorted(tree["posterior"].data_vars) == ["grp%2Fs", "theta"]
    np.testing.assert_array_equal(tree["posterior"]["grp%2Fs"].values, [np.arange(4.0)])


def test_names_of_arvizs_dimensions_one_values_and_no_variables_are_refused_not_dropped(az):
    for samples, message in [
        ({"chain": np.ones(3), "x": np.ones(3)}, r"'chain' has the name of one of ArviZ's dimensions"),
        ({"draw": np.ones(3)}, r"'draw' has the name"),
        ({"m": np.ones((3, 2)), "m_dim_0": np.ones(3)}, r"'m_dim_0' has the name"),
        ({"x": np.float32(3)}, r"'x' is one value, not an array of draws"),
        ({}, r"the samples hold no variables"),
    ]:
        with pytest.raises(JaxstowError, match=message):
            io.to_inference_data({"sample_count": 3, "samples": samples})
    assert "theta_dim_0" in io.to_inference_data({"sample_count": 3, "samples": {"theta_dim_0": np.ones(3)}}).posterior


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"dims": {"theta": ["sign", "extra"]}}, r"dims\['theta'\] names 2 axes .*have 1 axis: .*shape \(2,\)"),
        ({"dims": {"mu": ["a"]}}, r"dims\['mu'\] names 1 axis \(\['a'\]\), but the draws of 'mu' have 0 axes"),
        ({"dims": {"thetta": ["sign"]}}, r"dims names 'thetta', which is no variable of the draws: .*'theta'"),
        ({"dims": {"theta": [0]}}, r"dims\['theta'\] is \[0\], but it takes a list of names \(str\).*shape \(2,\)"),
        ({"dims": {"theta": "sign"}}, r"dims\['theta'\] is 'sign', but it takes a list of names"),
        ({"dims": {"theta": ["chain"]}}, r"dims\['theta'\] names an axis 'chain'"),
        ({"dims": {"theta": ["k"], "w": ["k", "j"]}}, r"dimension 'k' is axis 0 of the draws of 'w', shape \(3, 4\)"),
        ({"dims": ["theta"]}, r"dims maps each variable to the names of the axes of its draws"),
        ({"dims": {"theta": ["sign"]}, "coords": {"sign": ["+"]}}, r"coords\['sign'\] is \['\+'\], .*shape \(2,\)"),
        ({"coords": {"sgn": ["+", "-"]}}, r"coords names 'sgn', which is no dimension of the draws"),
        ({"coords": {"chain": ["only one"]}}, r"coords\['chain'\] .*the 2 chains: give a list of 2 labels"),
        ({"coords": {"theta_dim_0": 5}}, r"coords\['theta_dim_0'\] is 5, .*give a list of 2 labels"),
    ],
)
def test_dims_and_coords_that_do_not_fit_the_draws_name_the_variable_and_its_shape(labels, message, az):
    """ArviZ raised KeyError or xarray's errors naming no variable, or padded a dimension of two lengths with NaN
    and ignored dims of a variable that does not exist; at ArviZ 1.x, dims naming 'chain' stretched the chains."""
    chain = {"sample_count": 4, "samples": {"theta": np.ones((4, 2)), "mu": np.ones(4), "w": np.ones((4, 3, 4))}}
    with pytest.raises(ArgumentError, match=message):
        io.to_inference_data([chain, chain], **labels)
    data = io.to_inference_data(
        [chain, chain], dims={"theta": ("sign",), "w": ["k", "j"]}, coords={"sign": ["+", "-"], "chain": ["a", "b"]}
    )
    assert dict(data.posterior["w"].sizes) == {"chain": 2, "draw": 4, "k": 3, "j": 4}
    assert list(data.posterior["theta"].coords["sign"].values) == ["+", "-"]
