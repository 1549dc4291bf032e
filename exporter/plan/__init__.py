"""``kv-headroom plan``: ``cli`` (the command), ``advice`` (what would work, laid out),
``traffic`` (headroom in units of a request log, ``--traffic``) and ``recommend`` (the
cheapest deployments that hold it). The sizing arithmetic itself is ``capacity.plan``."""
