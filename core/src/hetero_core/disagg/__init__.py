"""Prefill/decode disaggregation: a prefill engine and a decode engine, each in its own process, behind
one OpenAI front end (docs/disaggregation.md).

``role_apps``: the HTTP apps of ``hetero serve --role prefill|decode``; ``client``: what the front end's
OpenAI app uses instead of an ``AsyncLLM`` (a request is prefilled by one role, its KV blocks move
through the KV connector, the other role streams the rest); ``launcher``: ``hetero serve --role ...``
and ``--disaggregated`` (both roles as child processes plus the front end); ``wire``: the frames the
front end and the roles exchange (pickles: loopback or a trusted network only).
"""
