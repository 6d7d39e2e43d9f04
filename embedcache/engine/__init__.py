"""The engine: plan -> batch -> forward -> commit, in this process or on Dask.

One public call for every front end, :func:`embedcache.engine.api.embed_into_store`
(with :func:`~embedcache.engine.api.embed_file` and
:func:`~embedcache.engine.api.embed_version` around it). The modules, in the order
the data flows through them:

- ``api``: the front ends' call; resolves the model, opens the store, picks the path
- ``plan``: validate, hash, length-check, store lookup; work units; the result records
- ``batching``: which sequences share a forward pass (length-sorted, within budgets)
- ``forward``: a unit through the adapter and committed to the store, and read back
- ``local``: the in-process path, :func:`~embedcache.engine.local.embed_sequences`
- ``memory``: keep freed activation memory in the process (glibc ``mallopt``)
- ``cluster``: the Dask client, :func:`~embedcache.engine.cluster.embed_on_cluster`
- ``unit_queue``: units cut on demand, sized to a worker's measured rate
- ``worker``: the Dask worker plugin and task, and what a task receives
- ``dask_setup``: start a local cluster or reach a scheduler
- ``output``: the ``.npy`` a command writes, atomically (light: the client uses it)

May import the bottom floor (``errors``, ``hashing``, ``specs``), ``data``,
``models`` and ``store``; never ``analysis``, ``report`` or ``cli``. Dask is imported
only by ``cluster``, ``worker`` and ``dask_setup``, which ``api`` imports when a
cluster is asked for.
"""

from __future__ import annotations
