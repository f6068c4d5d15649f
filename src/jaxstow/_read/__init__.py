"""The read path.

A file opened lazily (its leaves by path), slices read by byte ranges, a restore planned from the header (targets,
casts, selections, shardings) and then read. It imports the layers below it and never the write path or a face.
"""
