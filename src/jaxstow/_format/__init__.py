"""The bytes of one file.

Key paths, the skeleton codec (a tree's structure as JSON) with the manifest schema it belongs to, the dtype table,
checksums, strict JSON values and their codec, the native (safetensors) and npz containers, and fast aligned reads of
tensors from a :class:`~jaxstow._format.source.ReadSource`. It must not import the storage layer or anything above it:
where the bytes come from is the storage layer's business.
"""
