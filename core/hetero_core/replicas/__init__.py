"""Engine replicas behind Ray Serve (``hetero serve --replicas N``); needs ``hetero-core[ray]``.

``deployment.py`` builds the Ray Serve application: N ``EngineReplica`` deployments (one engine each)
and one ``Frontend`` (the OpenAI app of ``hetero_core.server`` over a ``ReplicaClient``), routed by
``FewestQueuedTokensRouter``. ``launcher.py`` starts it on a local Ray instance or an existing cluster.
Only those modules import Ray; this one does not, so ``import hetero_core`` never does.
"""

RAY_EXTRA_HINT = "replicas run on Ray Serve: pip install 'hetero-core[ray]'"
