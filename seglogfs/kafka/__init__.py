"""Kafka's wire protocol in the daemon: a single-node Kafka endpoint beside the mount.

``seglogfs mount LOGDIR MNT --kafka HOST:PORT`` (or ``listeners=`` in ``--config``)
starts ``server.serve`` in the daemon's trio nursery. Modules, one responsibility each:

- ``codec``: frames, request and response headers, kio's generated message types
  (Kafka's JSON schemas) and ``build`` for responses of any version;
- ``versions``: the API versions answered; ``dispatch``: API key to handler,
  ``UNSUPPORTED_VERSION`` for the rest;
- one module per API family: ``api_versions``, ``metadata``, ``produce`` (and
  ``producers``: producer ids and sequence checks), ``fetch``, ``offsets``
  (ListOffsets, OffsetCommit, OffsetFetch), ``groups`` (FindCoordinator and the classic
  group protocol's requests) over ``coordinator`` (the rebalance state machine on the
  directory's ``OffsetStore``); the admin APIs: ``topics`` (CreateTopics, DeleteTopics,
  CreatePartitions, DeleteRecords), ``configs`` (DescribeConfigs, AlterConfigs,
  IncrementalAlterConfigs), ``group_admin`` (ListGroups, DescribeGroups, DeleteGroups);
- ``broker``: what the handlers share; ``config``: the listener's settings;
  ``server``: the trio TCP listener and its connections.

It imports the engine's public API, trio and kio; never the file system's modules, so
the daemon hands it the engine and its worker-thread bridge.
"""
