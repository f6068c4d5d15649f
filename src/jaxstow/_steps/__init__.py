"""Numbered steps in a folder.

Their names (``'%d'``, ``'%010d.npz'``), their record (``checkpoint.json``, written last, checksummed) and the keep
policy that decides which to delete. It imports the format and storage layers and nothing above them (no read or write
path, no face).
"""
