"""The ``leasefs`` command line (console script ``leasefs`` = ``python -m tools``).

At the top, what every command shares: ``cli`` parses and dispatches (``COMMANDS`` names
each command's module), ``hdfsnames`` rewrites HDFS's spelling first, ``common`` (settings,
the client, one-line errors, ``command_parser``), ``formatting`` (text in and out, no I/O),
``progress`` (stderr progress); ``docgen`` and ``cmddoc`` print the settings and the
commands (and keep docs/SETTINGS.md and docs/SHELL.md current). The commands live in packages: ``shell`` (file commands, ``hdfs dfs``), ``admin``
(``dfsadmin``, ``haadmin``, fsck, quotas, tokens), ``cluster`` (servers, the embedded local
cluster, the mount), ``bench`` (benchmarks); ``testbed`` holds the breakable networks the
benchmarks and tests use. Imports go downwards only: the packages use the top modules, ``bench`` uses ``cluster`` and
``testbed``, ``cluster``'s HA launcher asks ``admin.haadmin`` for roles, ``admin`` uses
``shell``; never the other way (tests/test_layering.py).
"""
