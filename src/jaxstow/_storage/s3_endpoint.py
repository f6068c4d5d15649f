"""The endpoint of ``s3://`` URLs: the one a call's storage options give wins over the one fsspec's configuration gives.

s3fs takes an endpoint in two places, ``endpoint_url`` and ``client_kwargs={"endpoint_url": ...}``, and fsspec fills
in each from its configuration (``FSSPEC_S3_ENDPOINT_URL``, ``FSSPEC_S3``) where the options leave it out: an
endpoint given in one place and configured in the other, differently, reached botocore twice (a ``TypeError``). Here
the given one is put in both places; two different ones in one set of options are an
:class:`~jaxstow.errors.ArgumentError`.

>>> from jaxstow._storage.s3_endpoint import with_endpoint
>>> given = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:8333"}}
>>> with_endpoint("s3://bucket/model.jxs", given, configured={"endpoint_url": "http://127.0.0.1:9000"})
{'client_kwargs': {'endpoint_url': 'http://127.0.0.1:8333'}, 'endpoint_url': 'http://127.0.0.1:8333'}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxstow.errors import ArgumentError, excerpt

__all__ = ["with_endpoint"]


def with_endpoint(url: str, options: Mapping[str, Any], configured: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` of ``url`` with the endpoint they give in both of s3fs's places; as they are where they give none.

    ``configured`` is what fsspec's configuration gives s3fs: its ``client_kwargs`` stay (as they would without an
    endpoint given) unless ``options`` give their own.
    """
    endpoint = _endpoint(url, options, "storage_options")
    if endpoint is None:
        _endpoint(url, configured, _CONFIGURATION)
        return dict(options)
    given = "client_kwargs" in options
    client_kwargs = _client_kwargs(
        url, options if given else configured, "storage_options" if given else _CONFIGURATION
    )
    return {**options, "client_kwargs": {**client_kwargs, "endpoint_url": endpoint}, "endpoint_url": endpoint}


_CONFIGURATION = "fsspec's configuration (FSSPEC_S3_ENDPOINT_URL, FSSPEC_S3)"


def _endpoint(url: str, options: Mapping[str, Any], what: str) -> str | None:
    """The endpoint ``options`` give, in either place; ``None`` where they give none."""
    top, inner = options.get("endpoint_url"), _client_kwargs(url, options, what).get("endpoint_url")
    if top is not None and inner is not None and top != inner:
        raise ArgumentError(
            f"{url}: {what} give two endpoints, endpoint_url {top!r} and client_kwargs' endpoint_url {inner!r}: give one"
        )
    return top if top is not None else inner


def _client_kwargs(url: str, options: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    client_kwargs = options.get("client_kwargs") or {}
    if not isinstance(client_kwargs, Mapping):
        raise ArgumentError(
            f"{url}: {what}: client_kwargs must be a dict of botocore's options, not {excerpt(client_kwargs)}"
        )
    return client_kwargs
