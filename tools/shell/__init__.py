"""The file commands (``hdfs dfs``'s): ``core`` (ls, stat, cat, put, get, cp, mv, rm, mkdir,
du, df, chmod, ... and report, safemode) with the helpers the others share (``user_path``,
``walk``); one module per smaller family (``alias``, ``attr``, ``count``, ``find``, ``read``,
``testpath``, ``leases``, ``concat``, ``checksum``); ``transfer``, the copy engine of
put/get/cp. They reach the cluster only through ``fs.client.Client``.
"""
