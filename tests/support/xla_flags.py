"""The ``XLA_FLAGS`` of the suite's processes: CPU devices to shard over, and XLA's CPU compiler without its costly
optimizations, which take most of the time of compiling the suite's many small programs and none of which a test
depends on (a program gives the same results, compiled either way, in every process of the suite).

>>> xla_flags(4).split()[0]
'--xla_force_host_platform_device_count=4'
"""

from __future__ import annotations

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def xla_flags(devices: int) -> str:
    """``XLA_FLAGS`` for a process of the suite with ``devices`` CPU devices."""
    return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"
