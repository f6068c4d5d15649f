"""Where bytes live.

Local files written atomically, sources read by position (``pread``), fsspec URLs (the ``remote`` module, imported only
when a URL is given), folders committed whole (a rename locally, a marker written last on object stores), and the
writer's lock of a directory. It imports the format layer's source protocol and nothing of trees, steps, reading or
writing plans.
"""
