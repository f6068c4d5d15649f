"""The write path.

A tree encoded for writing (manifest and host arrays), held for a background save, written by a background writer that
carries errors back, with a report of the bytes written. It imports the layers below it and never the read path or a
face.
"""
