"""The exporter's image cache: nothing unverified is handed out, a good copy is not fetched
again, a damaged one is, and the cache keeps to its size."""
import hashlib
import os

import pytest

from device_loop.core.model import OperationError
from device_loop.exporter.image_cache import ImageCache

A, B = os.urandom(3 << 20), os.urandom(2 << 20)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Registry:
    """Serves images in pieces, and counts the fetches."""

    def __init__(self, **images):
        self.images = {sha(data): data for data in images.values()}
        self.fetches = 0

    def fetcher(self, digest: str, data: bytes | None = None):
        def fetch():
            self.fetches += 1
            body = self.images[digest] if data is None else data
            for start in range(0, len(body), 1 << 20):
                yield body[start:start + (1 << 20)]
        return fetch


def get(cache: ImageCache, registry: Registry, data: bytes, served: bytes | None = None):
    with cache.use(sha(data)):
        return cache.get(sha(data), len(data), registry.fetcher(sha(data), served), lambda done: None)


def test_a_cached_image_is_fetched_once_and_checked_again_after_a_restart(tmp_path):
    registry = Registry(a=A)
    cache = ImageCache(tmp_path, max_bytes=1 << 30)
    path = get(cache, registry, A)
    assert path.read_bytes() == A and get(cache, registry, A) == path and registry.fetches == 1
    os.chmod(path, 0o644)
    damaged = bytearray(A)
    damaged[5] ^= 1
    path.write_bytes(damaged)
    assert get(cache, registry, A).read_bytes() == A and registry.fetches == 2, "a changed copy is checked again"
    restarted = ImageCache(tmp_path, max_bytes=1 << 30)
    assert get(restarted, registry, A).read_bytes() == A and registry.fetches == 2, "a good copy is kept"
    os.truncate(path, 10)
    assert get(ImageCache(tmp_path, max_bytes=1 << 30), registry, A).read_bytes() == A and registry.fetches == 3


def test_bytes_that_do_not_match_their_sha256_never_enter_the_cache(tmp_path):
    registry = Registry(a=A)
    cache = ImageCache(tmp_path, max_bytes=1 << 30)
    for served, said in ((A[:-1] + b"x", "hash to"), (A[:100], "sent 100 of"), (A + b"more", "more than")):
        with pytest.raises(OperationError, match=said):
            get(cache, registry, A, served)
        assert list(tmp_path.iterdir()) == [], "nothing is left of a refused fetch"


def test_the_cache_drops_the_least_recently_used_image_to_keep_its_size(tmp_path):
    """Only least-recently-used passes: the first drop is neither the oldest fetched, the most
    recently used nor the smallest; the second is not the largest."""
    one, two, one_and_a_half = os.urandom(1 << 20), os.urandom(2 << 20), os.urandom(3 << 19)
    registry = Registry(one=one, two=two, one_and_a_half=one_and_a_half, another_two=B)
    cache = ImageCache(tmp_path, max_bytes=4 << 20)

    def kept():
        return sorted(p.name for p in tmp_path.iterdir())

    get(cache, registry, one)
    get(cache, registry, two)
    get(cache, registry, one)  # used again: now two is the least recently used
    get(cache, registry, one_and_a_half)  # 4.5 MiB: two goes
    assert kept() == sorted([sha(one), sha(one_and_a_half)])
    get(cache, registry, one)
    get(cache, registry, one_and_a_half)  # one is the least recently used, and the smaller
    get(cache, registry, B)  # 4.5 MiB again
    assert kept() == sorted([sha(one_and_a_half), sha(B)])
    assert registry.fetches == 4, "a cached image is not fetched again"
