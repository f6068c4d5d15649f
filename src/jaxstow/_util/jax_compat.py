"""Everything jaxstow uses of jax beyond its public API, in one place, per jax version.

jaxstow is tested with jax 0.4.38 to 0.12. Three features need more than jax's public API: the host callback that
hands blocks of samples to the host without a copy (:mod:`jaxstow.io.host_block`), the per-chain saving states that
``io.save``'s ``init_save`` returns under ``jax.vmap`` (:mod:`jaxstow.io.saving`), and the messages between the
processes of a ``jax.distributed`` run (:mod:`jaxstow._coordination`). They use only what this module gives,
and this module uses only the names of jax's in :data:`SHIMS` (and, where jax has them, :data:`OPTIONAL_SHIMS`),
each a :class:`Shim` saying what it is for; each function says where jax versions differ. A name of :data:`SHIMS`
the installed jax lacks raises a :class:`~jaxstow.errors.MissingDependencyError` naming the jax version, the name
and its purpose, where the feature that needs it starts (``import jaxstow.io``, a loop's compilation, ``init_save``, a checkpoint saved by several
processes). Three more, :data:`OPTIONAL_SHIMS`, are used where the installed jax has them: a ``lax.switch``
without its clamp, the conversion that restores an array saved weakly typed as one, and the broadcast of a prefix
tree on jax before ``jax.tree.broadcast``.

>>> from jaxstow._util import jax_compat
>>> jax_compat.new_primitive("example").name
'example'
>>> [shim.name for shim in jax_compat.SHIMS][-1]
'jax._src.interpreters.batching.BatchTracer'
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend.mlir.dialects import stablehlo

from jaxstow.errors import MissingDependencyError

__all__ = [
    "JAX_VERSION",
    "SHIMS",
    "Shim",
    "device_position",
    "distributed_client",
    "emit_host_callback",
    "lowers_for_one_device",
    "lowers_per_device",
    "enclosing_vmaps",
    "mapped_by",
    "new_primitive",
    "one_device_sharding",
    "register_uncached_lowering",
    "shaped_array",
    "switch_in_range",
    "tree_broadcast",
    "typed_as",
    "weakly_typed",
]

#: The installed jax's version, as numbers: ``(0, 10, 2)``.
JAX_VERSION: tuple[int, ...] = tuple(jax.__version_info__)
#: The jax versions jaxstow is tested with.
TESTED = "0.4.38 to 0.12"
#: Whether ``io.save``'s calls to the host are, on the CPU, XLA FFI calls of a handler of jaxstow's own, which reads
#: XLA's FFI C API (``jaxstow.io.xla_ffi``): on the jax versions whose header it was checked against and tested with,
#: 0.10 to 0.12. On the others they are jax's Python host callbacks (right, but a loop holding one runs slower on the
#: CPU).
OWN_FFI_CALLS = (0, 10) <= JAX_VERSION[:2] <= (0, 12)


@dataclasses.dataclass(frozen=True)
class Shim:
    """A name of jax's beyond its public API: the module it is in, the attributes to it, and what jaxstow uses it for."""

    module: str
    attribute: str
    purpose: str

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attribute}"

    def resolve(self) -> Any:
        """The object the name stands for in the installed jax.

        Raises:
            MissingDependencyError: the installed jax has no such name; the message says what it was for.
        """
        try:
            found: Any = importlib.import_module(self.module)
            for attribute in self.attribute.split("."):
                found = getattr(found, attribute)
        except (ImportError, AttributeError):
            raise MissingDependencyError(
                f"jax {jax.__version__} has no {self.name}, which jaxstow uses {self.purpose}; jaxstow is tested "
                f"with jax {TESTED}: install a jax in that range"
            ) from None
        return found


PRIMITIVE = Shim("jax.extend.core", "Primitive", "for the primitive of its host callback of blocks of samples")
SHAPED_ARRAY = Shim("jax.core", "ShapedArray", "for the abstract value of its host callback's answer")
REGISTER_LOWERING = Shim(
    "jax.interpreters.mlir", "register_lowering", "to lower its host callback of blocks of samples"
)
EMIT_PYTHON_CALLBACK = Shim(
    "jax.interpreters.mlir", "emit_python_callback", "to hand blocks of samples to the host without copying them"
)
CALLBACK_OP_SHARDING = Shim(
    "jax._src.callback",
    "_callback_op_sharding",
    "to run its host callback on one device of a sharded computation, as jax.pure_callback does (without it each "
    "block of samples would arrive once per device)",
)
DISTRIBUTED_CLIENT = Shim(
    "jax._src.distributed",
    "global_state.client",
    "to exchange a checkpoint's messages between the processes of a jax.distributed run",
)
CURRENT_TRACE = Shim(
    "jax._src.core",
    "unsafe_get_current_trace",
    "to find the jax.vmap calls around io.save's init_save, which registers one chain per element they map",
)
BATCH_TRACE = Shim("jax._src.interpreters.batching", "BatchTrace", "to tell a jax.vmap's trace apart and read its size")
BATCH_TRACER = Shim(
    "jax._src.interpreters.batching",
    "BatchTracer",
    "to return init_save's per-chain saving states mapped by the jax.vmap calls around it",
)
SWITCH_IN_RANGE = Shim(
    "jax._src.lax.control_flow.conditionals",
    "_switch_internal",
    "to branch on an index known to be in range without lax.switch's clamp, which XLA's CPU runtime runs as a step of "
    "its own at every iteration of a loop",
)
WEAK_TYPE = Shim(
    "jax._src.lax.lax",
    "_convert_element_type",
    "to restore an array saved weakly typed (jnp.asarray(2.0)) as one, which promotes as a Python scalar does",
)
BROADCAST_PREFIX = Shim(
    "jax._src.tree_util",
    "broadcast_prefix",
    "to lay a tree of shardings over the restored tree on jax before jax.tree.broadcast (0.4.38)",
)
NODE_REGISTRY = Shim(
    "jax._src.tree_util",
    "_registry",
    "to check a file's static data against a class registered with jax.tree_util.register_dataclass, which jax "
    "rebuilds from too few static values by reading past them (the process crashes)",
)
#: The names jaxstow uses where the installed jax has them, and does without otherwise.
OPTIONAL_SHIMS = (SWITCH_IN_RANGE, WEAK_TYPE, BROADCAST_PREFIX, NODE_REGISTRY)
#: Every name of jax's that jaxstow needs beyond its public API.
SHIMS = (
    PRIMITIVE,
    SHAPED_ARRAY,
    REGISTER_LOWERING,
    EMIT_PYTHON_CALLBACK,
    CALLBACK_OP_SHARDING,
    DISTRIBUTED_CLIENT,
    CURRENT_TRACE,
    BATCH_TRACE,
    BATCH_TRACER,
)


def new_primitive(name: str) -> Any:
    """A new ``jax.extend.core.Primitive`` named ``name``."""
    return PRIMITIVE.resolve()(name)


def shaped_array(shape: tuple[int, ...], dtype: Any) -> Any:
    """The abstract value (``jax.core.ShapedArray``) of an array of ``shape`` and ``dtype``."""
    return SHAPED_ARRAY.resolve()(shape, dtype)


def register_uncached_lowering(primitive: Any, rule: Callable[..., Any], platform: str | None = None) -> None:
    """Register ``rule`` as the lowering of ``primitive`` on ``platform`` (every one by default), called at every
    lowering.

    Each call has its own receiving function, which a lowering cached by parameters would call stale: jax caches
    lowerings from 0.7.0 on unless given ``cacheable=False`` (0.4.38 to 0.6 cache none).
    """
    extra = {"cacheable": False} if JAX_VERSION >= (0, 7, 0) else {}
    REGISTER_LOWERING.resolve()(primitive, rule, platform=platform, **extra)


def one_device_sharding(ctx: Any) -> Any:
    """The sharding that runs a host callback lowered in ``ctx`` on one device of a sharded computation.

    As ``jax.pure_callback`` pins its own, else each block of samples would arrive once per device. jax's function
    takes ``(axis_context, sharding)`` in 0.4.38 and ``(axis_context, sharding, avals_out)`` from 0.5.0 on.
    """
    pin = CALLBACK_OP_SHARDING.resolve()
    context = ctx.module_context.axis_context
    return pin(context, None) if JAX_VERSION < (0, 5, 0) else pin(context, None, ctx.avals_out)


def emit_host_callback(
    ctx: Any,
    callback: Callable[..., Sequence[Any]],
    operands: Sequence[Any],
    *,
    has_side_effect: bool = False,
    operand_avals: Sequence[Any] | None = None,
) -> Sequence[Any]:
    """Emit XLA's Python host callback of ``callback`` on ``operands`` in the lowering rule's context ``ctx``.

    As ``jax.pure_callback`` emits it (free of side effects for XLA unless ``has_side_effect``) and run on one device,
    but without its copy of every operand to the CPU device; returns its results. ``operand_avals``: those of
    ``operands``, where they are not the rule's own (``ctx.avals_in``). ``returns_token=False`` from jax 0.8.2 on
    (before, it returns no token unless given one).
    """
    emit = EMIT_PYTHON_CALLBACK.resolve()
    if operand_avals is not None:
        ctx = dataclasses.replace(ctx, avals_in=list(operand_avals))
    extra = {"returns_token": False} if JAX_VERSION >= (0, 8, 2) else {}
    results, _, _ = emit(
        ctx,
        callback,
        None,
        list(operands),
        ctx.avals_in,
        ctx.avals_out,
        has_side_effect=has_side_effect,
        sharding=one_device_sharding(ctx),
        **extra,
    )
    return list(results)


def lowers_for_one_device(ctx: Any) -> bool:
    """Whether the lowering rule's context ``ctx`` lowers a computation that runs on one device (not sharded over
    several, nor per device under ``shard_map`` or ``pmap``)."""
    return getattr(ctx.module_context.axis_context, "num_devices", None) == 1


def lowers_per_device(ctx: Any) -> bool:
    """Whether the lowering rule's context ``ctx`` lowers a computation that each device runs on its own share
    (inside ``shard_map``, or ``pmap``, which jax lowers as one): a host callback there runs once per device."""
    return bool(getattr(ctx.module_context.axis_context, "manual_axes", None))


def device_position() -> list[Any]:
    """The device's replica and partition numbers (uint32), as values of the computation a lowering rule emits:
    together they tell apart the devices that run a computation lowered per device."""
    return [stablehlo.ReplicaIdOp().result, stablehlo.PartitionIdOp().result]


def enclosing_vmaps() -> list[tuple[Any, int]]:
    """The ``jax.vmap`` calls around the caller, outermost first: each one's trace and size (none outside vmap).

    Only those inside the innermost other transformation (``jit``, ``scan``, ``grad``, ...) count: a value of theirs
    must not leave it. From 0.4.38 on, each trace names the one around it as ``parent_trace``.
    """
    batch_trace = BATCH_TRACE.resolve()
    trace, found = CURRENT_TRACE.resolve()(), []
    while isinstance(trace, batch_trace):
        found.append((trace, int(trace.axis_data.size)))
        trace = trace.parent_trace
    if found:
        BATCH_TRACER.resolve()  # before the caller acts on the vmaps: it will need the name to return its values
    return found[::-1]


def mapped_by(value: Any, vmaps: Sequence[tuple[Any, int]]) -> Any:
    """``value``, whose leading axes are one per ``vmaps`` entry (from :func:`enclosing_vmaps`), as those ``vmap``
    calls' functions see a value mapped along them: one element of it per call."""
    tracer = BATCH_TRACER.resolve()
    for trace, _ in vmaps:
        value = tracer(trace, value, 0)
    return value


def switch_in_range(index: jax.Array, branches: Sequence[Callable[..., Any]], *operands: Any) -> Any:
    """``jax.lax.switch(index, branches, *operands)`` for an int32 ``index`` known to name one of the ``branches``:
    without the clamp ``lax.switch`` puts before the branch, where the installed jax allows (:data:`OPTIONAL_SHIMS`).

    >>> import jax.numpy as jnp
    >>> int(switch_in_range(jnp.int32(1), [lambda x: x - 1, lambda x: x + 1], 41))
    42
    """
    try:
        in_range = SWITCH_IN_RANGE.resolve()
    except MissingDependencyError:
        return jax.lax.switch(index, branches, *operands)
    return in_range(index, branches, operands, branches_platforms=None)


def typed_as(value: Any, leaf: Any) -> Any:
    """``value`` weakly typed where ``leaf`` is (a jax array, a ``ShapeDtypeStruct``), strongly where it is not.

    >>> import jax, jax.numpy as jnp
    >>> typed_as(jnp.asarray(2.0), jax.ShapeDtypeStruct((), jnp.float32)).weak_type
    False
    """
    weak, now = getattr(leaf, "weak_type", None), getattr(value, "weak_type", None)  # a key array has no weak type
    if not isinstance(value, jax.Array) or not isinstance(weak, bool) or not isinstance(now, bool) or now == weak:
        return value
    return weakly_typed(value, weak)


def weakly_typed(array: jax.Array, weak: bool = True) -> jax.Array:
    """``array`` as a weakly typed array of its dtype and sharding (as ``jnp.asarray(2.0)`` is), which promotes as a
    Python scalar does (with ``weak=False``, as a strongly typed one), in its memory (an array in host memory is
    converted on its device and put back); ``array`` itself where the installed jax lacks the means
    (:data:`OPTIONAL_SHIMS`).

    >>> import jax.numpy as jnp
    >>> weak = weakly_typed(jnp.float32(2.0))
    >>> weak.weak_type, (jnp.ones(2, jnp.bfloat16) * weak).dtype
    (True, dtype(bfloat16))
    """
    try:
        convert = WEAK_TYPE.resolve()
    except MissingDependencyError:
        return array
    sharding = array.sharding
    computed = _default_memory_kind(sharding)
    if sharding.memory_kind not in (None, computed):  # host memory: converted on the device, then put back
        on_device = jax.device_put(array, sharding.with_memory_kind(computed))
        back: jax.Array = jax.device_put(convert(on_device, array.dtype, weak_type=weak), sharding)
        return back
    typed: jax.Array = convert(array, array.dtype, weak_type=weak)
    if typed.sharding != sharding:  # the same layout, its spec written out in full (an explicit mesh's): as it was
        typed = jax.device_put(typed, sharding)
    return typed


def _default_memory_kind(sharding: jax.sharding.Sharding) -> str:
    """The memory kind computations on ``sharding``'s devices use (``device``; a CPU's ``unpinned_host`` at jax 0.4)."""
    device: Any = next(iter(sharding.device_set))
    return str(device.default_memory().kind)


def tree_broadcast(prefix: Any, full: Any, *, is_leaf: Callable[[Any], bool]) -> Any:
    """``jax.tree.broadcast(prefix, full, is_leaf=is_leaf)``, on jax before it (0.4.38) too.

    >>> tree_broadcast({"a": 1, "b": None}, {"a": [0, 0], "b": 0}, is_leaf=lambda x: x is None)
    {'a': [1, 1], 'b': None}
    """
    public = getattr(jax.tree, "broadcast", None)
    if public is not None:
        return public(prefix, full, is_leaf=is_leaf)
    leaves = BROADCAST_PREFIX.resolve()(prefix, full, is_leaf=is_leaf)
    return jax.tree.unflatten(jax.tree.structure(full), leaves)


def distributed_client() -> Any:
    """The client of this ``jax.distributed`` run's coordination service (jax has no public handle on it).

    ``None`` before ``jax.distributed.initialize()``.
    """
    return DISTRIBUTED_CLIENT.resolve()


def dataclass_fields(node_type: type) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The data fields (the children, in order) and the static fields (the static data, in order) of a class
    registered with ``jax.tree_util.register_dataclass``; ``None`` for another class, or where the installed jax does
    not tell them (:data:`OPTIONAL_SHIMS`).

    >>> import dataclasses, jax
    >>> @jax.tree_util.register_dataclass
    ... @dataclasses.dataclass
    ... class Layer:
    ...     w: jax.Array
    ...     width: int = dataclasses.field(metadata={"static": True})
    >>> dataclass_fields(Layer), dataclass_fields(dict)
    ((('w',), ('width',)), None)
    """
    try:
        registry = NODE_REGISTRY.resolve()
    except MissingDependencyError:
        return None
    flatten = getattr(registry.get(node_type), "to_iter", None)
    code, cells = getattr(flatten, "__code__", None), getattr(flatten, "__closure__", None) or ()
    if code is None or not getattr(flatten, "__qualname__", "").lstrip("_").startswith("register_dataclass."):
        return None
    found = dict(zip(code.co_freevars, (cell.cell_contents for cell in cells), strict=False))
    data, meta = found.get("data_fields"), found.get("meta_fields")
    if not (isinstance(data, tuple | list) and isinstance(meta, tuple | list)):
        return None
    return tuple(data), tuple(meta)
