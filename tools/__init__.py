"""The ``leasefs`` command line (console script ``leasefs`` = ``python -m tools``).

``cli`` parses and dispatches; ``daemons`` runs ``meta``/``storage`` servers; ``cluster`` is
the embedded local cluster launcher; ``shell`` the ``hdfs dfs``-style tools on top of the
public ``fs.client.Client``, with ``transfer`` (copies), ``formatting`` (text in and out),
``progress`` (stderr progress) and ``common`` (settings, client, one-line errors); ``bench``
the benchmarks; ``docgen`` the settings table of docs/SETTINGS.md.
"""
