"""How the processes of a ``jax.distributed`` run agree: one coordinator over jax's own key-value store and barriers.

Every agreement between processes (which step is due, which step to restore and from where, who holds what, who
failed and why) is a :class:`Conversation` of a :class:`Coordinator`: structured messages, each wait bounded by the
run's ``process_timeout``, a decision made once by one process and published (or agreed by a maximum), never
recomputed from each process's own listing. One process is the N=1 case of the same code. This layer knows jax's
coordination service and nothing of files: it must not import the storage, steps, read or write layers, or the faces.
"""

from jaxstow._coordination.coordinator import Conversation, Coordinator

__all__ = ["Conversation", "Coordinator"]
