"""Fixtures of the fault tests: moto behind the fault proxy, a small filesystem."""

from __future__ import annotations

import pytest

from tests.faults.proxy import start_proxy
from tests.store.conftest import StoreHandle, new_bucket, s3_endpoint, s3_options

__all__ = ["s3_endpoint"]

# quick retries: the tests inject many faults, and a dead store should fail fast
FAST_RETRIES = {"aws_init_backoff": "0.02", "aws_max_backoff": "0.2"}


@pytest.fixture(scope="module")
def proxy(s3_endpoint):
    """The fault proxy in front of this module's moto server (faults off)."""
    proxy = start_proxy(s3_endpoint, stall_s=2.0, seed=21)
    yield proxy
    proxy.stop()


@pytest.fixture
def faulty(proxy, s3_endpoint):
    """A fresh bucket reached through the proxy, and the same bucket reached directly."""
    proxy.calm()
    proxy.reset_counts()
    url = f"s3://{new_bucket(s3_endpoint)}/embeddings"
    through = StoreHandle("s3", url, {**s3_options(proxy.url), **FAST_RETRIES})
    direct = StoreHandle("s3", url, s3_options(s3_endpoint))
    yield through, direct
    proxy.calm()
