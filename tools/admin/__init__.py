"""The administrator's commands (``hdfs dfsadmin``/``haadmin``/``fsck``/``fetchdt``):
``maintenance`` (fsck, decommission, save-namespace), ``quotas``, ``haadmin``, ``tokens``
(delegation tokens) and ``dfsadmin``, HDFS's verb spelling that runs the matching command
(also the shell's ``report`` and ``safemode``).
"""
