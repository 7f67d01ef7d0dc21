"""Running leasefs processes: ``daemons`` (``leasefs meta``/``storage`` in the foreground),
``embedded`` (``leasefs cluster up|down|status`` on one machine) with ``embedded_ha`` (its
``--ha``, on ``etcd``'s local members), ``processes`` (the home folder, state file and
server processes both launchers and the benchmarks share) and ``mountcmd`` (``leasefs
mount``/``umount``). The only part of ``tools`` that imports the servers (``meta``,
``storage``) and the mount.
"""
