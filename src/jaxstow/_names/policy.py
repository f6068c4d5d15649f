"""Which library objects a file may name: pure functions and classes only, nothing that can do harm when called.

A loaded model calls what its file names with arguments the file chose. So beyond the objects registered with
:func:`jaxstow.saveable`, a file may name only the activation, elementwise and reducing functions and scalar types of
the numeric libraries, and the classes and functions of the model libraries but for their serialisation, file and
debugging helpers (:mod:`jaxstow._names.libraries`). Nothing that reads, writes, imports, executes or allocates on
request is ever nameable. docs/safety.md lists what is and is not.

>>> import jax, numpy as np
>>> from jaxstow._names.policy import refusal
>>> refusal("jax.nn.relu", jax.nn.relu) is None, refusal("numpy.tanh", np.tanh) is None
(True, True)
>>> refusal("numpy.savetxt", np.savetxt)
'numpy.savetxt is not an activation, an elementwise or reducing function or a scalar type'
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np

from jaxstow._names.libraries import known

__all__ = ["FORBIDDEN_MODULES", "describe_policy", "module_of", "name_refusal", "refusal"]

#: Modules whose objects are never named, whatever library re-exports them.
FORBIDDEN_MODULES = frozenset(
    {
        "builtins", "os", "posix", "nt", "io", "_io", "subprocess", "importlib", "pickle", "_pickle", "marshal",
        "shelve", "shutil", "sys", "ctypes", "socket", "tempfile", "pathlib", "glob", "runpy", "code", "codeop",
        "multiprocessing", "threading", "signal", "mmap", "urllib", "http", "zipfile", "tarfile", "gzip", "bz2",
        "lzma", "pty", "webbrowser", "fsspec", "h5py", "msgpack", "orbax", "etils", "tensorstore",
    }
)  # fmt: skip
_HARMFUL_WORDS = (
    "serial", "save", "load", "checkpoint", "restore", "file", "open", "write", "read", "print", "callback",
    "debug", "breakpoint", "import", "exec", "eval", "io", "tabulate", "summary", "display", "generate", "config",
    "flag", "interceptor", "global", "dicts_to",
)  # fmt: skip
_SCALAR_META = type(jnp.float32)
#: numpy and jax.numpy functions that are not ufuncs but are as pure: reductions and layout changes, none of which
#: takes a size to allocate.
_ARRAY_FUNCTIONS = frozenset(
    {
        "sum", "mean", "max", "min", "prod", "std", "var", "median", "average", "argmax", "argmin", "amax", "amin",
        "all", "any", "nansum", "nanmean", "nanmax", "nanmin", "nanprod", "nanstd", "nanvar", "cumsum", "cumprod",
        "ravel", "reshape", "transpose", "squeeze", "expand_dims", "moveaxis", "swapaxes", "flip", "fliplr", "flipud",
        "where", "clip", "dot", "vdot", "inner", "einsum", "tensordot", "concatenate", "stack", "hstack", "vstack",
        "sort", "argsort", "round", "around", "nan_to_num", "real", "imag", "angle",
    }
)  # fmt: skip
#: jax.lax functions that allocate by a size, communicate, run control flow or reach the host; the rest of jax.lax
#: (arithmetic, ``dot_general``, convolutions, reductions, layout) is as pure as numpy's ufuncs.
_LAX_EXCLUDED = frozenset(
    {
        "after_all", "broadcast", "broadcast_in_dim", "broadcast_like", "broadcast_to_rank", "broadcasted_iota",
        "create_token", "empty", "full", "full_like", "iota", "pad", "tile", "rng_bit_generator", "rng_uniform",
        "psend", "precv", "ppermute", "pshuffle", "all_gather", "all_to_all", "ragged_all_to_all", "psum", "pmean",
        "pmax", "pmin", "psum_scatter", "pswapaxes", "pbroadcast", "pcast", "axis_index", "axis_size",
        "platform_dependent", "composite", "dce_sink", "optimization_barrier", "with_sharding_constraint",
        "shape_as_value", "stage", "custom_linear_solve", "custom_root", "cond", "switch", "while_loop", "fori_loop",
        "scan", "map", "associative_scan", "reduce", "reduce_window", "scatter_apply",
    }
)  # fmt: skip
#: The collectives of jax.lax by their names' starts, so that those a newer jax adds (``psum_scatter_start``) are too.
_LAX_COLLECTIVES = (
    "psum", "pmean", "pmax", "pmin", "ppermute", "pshuffle", "pswapaxes", "pbroadcast", "pcast", "psend", "precv",
    "all_gather", "all_to_all", "ragged_all_to_all", "axis_",
)  # fmt: skip
_ALLOWED_NUMERIC_PREFIXES = ("jax.nn.", "jax.scipy.special.")


def describe_policy() -> str:
    """One line naming the policy, for error messages.

    >>> print(describe_policy())  # doctest: +ELLIPSIS
    a file may name only pure functions and classes (..., scalar types, equinox/flax/optax/... classes) and objects registered with jaxstow.saveable
    """
    models = "/".join(library.name for library in known().libraries if library.policy == "model")
    return (
        "a file may name only pure functions and classes (jax.nn activations, elementwise and reducing numpy and "
        f"jax.numpy functions, scalar types, {models} classes) and objects registered with jaxstow.saveable"
    )


def refusal(name: str, obj: object) -> str | None:
    """Why the policy refuses to name ``obj`` as ``name``, or ``None`` when a file may name it."""
    defined_in = module_of(obj)
    for module in (defined_in, name):
        if module.partition(".")[0] in FORBIDDEN_MODULES:
            return f"{name} comes from {module.partition('.')[0]}, which a file may never name"
    policy = known().policy_of(name)
    if policy == "numeric" and not _is_pure_numeric(name, obj):
        return f"{name} is not an activation, an elementwise or reducing function or a scalar type"
    if policy == "model":
        words = [part.lower() for part in (*defined_in.split("."), *name.split("."))]
        harmful = next((word for word in _HARMFUL_WORDS for part in words if _names_word(part, word)), None)
        if harmful is not None:
            return f"{name} is a serialisation, file or debugging helper ({harmful!r}), which a file may never name"
    return None


def name_refusal(name: str) -> str | None:
    """Why the policy refuses ``name`` whatever object it would stand for, or ``None``: a name of a forbidden module,
    a name of a library of numeric functions other than those known to be pure, or a model library's helper.

    >>> name_refusal("os.system"), name_refusal("my_project.relu6")
    ('os.system comes from os, which a file may never name', None)
    """
    root = name.partition(".")[0]
    if root in FORBIDDEN_MODULES:
        return f"{name} comes from {root}, which a file may never name"
    policy = known().policy_of(name)
    if policy == "numeric":
        return f"{name} is not one of the activations, elementwise or reducing functions and scalar types it holds"
    if policy == "model":
        harmful = next(
            (word for word in _HARMFUL_WORDS for part in name.lower().split(".") if _names_word(part, word)), None
        )
        if harmful is not None:
            return f"{name} is a serialisation, file or debugging helper ({harmful!r}), which a file may never name"
    return None


def module_of(obj: object) -> str:
    """The module that defines ``obj`` (a class or function), or its type (another object); ``""`` if none says."""
    owner = obj if isinstance(obj, type) or callable(obj) else type(obj)
    module = getattr(owner, "__module__", None)
    return module if isinstance(module, str) else ""


def _names_word(part: str, word: str) -> bool:
    """Whether an identifier holds ``word`` as one of its ``_``-separated words (``io`` in ``flax.io``, not ``ratio``)."""
    return word in part.split("_") if len(word) <= 3 else word in part


def _is_pure_numeric(name: str, obj: object) -> bool:
    if isinstance(obj, np.ufunc | jnp.ufunc):
        return True
    if isinstance(obj, _SCALAR_META):
        return True
    if isinstance(obj, type):
        scalar = issubclass(obj, np.generic) and not issubclass(obj, np.flexible | np.object_)  # void(n): n bytes
        return scalar or obj is jax.tree_util.Partial
    if name.startswith(_ALLOWED_NUMERIC_PREFIXES) and not name.startswith("jax.nn.initializers."):
        return callable(obj) and not isinstance(obj, types.ModuleType)
    module, _, attribute = name.rpartition(".")
    if module == "jax.numpy.linalg":  # functions of the arrays they are given, none a constructor
        return callable(obj) and not isinstance(obj, type)
    if module == "jax.lax":
        return callable(obj) and attribute not in _LAX_EXCLUDED and not attribute.startswith(_LAX_COLLECTIVES)
    if module in ("numpy", "jax.numpy") and attribute in _ARRAY_FUNCTIONS:
        return callable(obj)
    return module == "jax.numpy" and isinstance(getattr(np, attribute, None), np.ufunc)
