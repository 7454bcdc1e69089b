"""Engine replicas behind Ray Serve (``hetero serve --replicas N``); needs ``hetero-core[ray]``.

``deployment.py`` builds the Ray Serve application: an ``EngineReplica`` deployment of N replicas (one
engine each) and one ``Frontend`` (the OpenAI app of ``hetero_core.server`` over a ``ReplicaClient``),
routed by ``FewestQueuedTokensRouter`` (its arithmetic, Ray-free, in ``ledger.py``). ``launcher.py``
starts it on a local Ray instance or an existing cluster. Those modules import Ray; this one and
``ledger.py`` do not, so ``import hetero_core`` never does.
"""

RAY_EXTRA_HINT = "replicas run on Ray Serve: pip install 'hetero-core[ray]'"
