"""The exporter's image cache: nothing unverified is handed out, a good copy is not fetched
again, a damaged one is, and the cache keeps to its size."""
import hashlib
import os

import pytest

from device_loop.core.model import OperationError
from device_loop.exporter.image_cache import ImageCache

A = os.urandom(3 << 20)


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


def test_the_cache_drops_the_least_recently_used_images_to_keep_its_size(tmp_path):
    """Exactly the least recently used go, as many as the new image needs, never one in use,
    and the order survives a restart. Each step tells LRU from another policy: the first drop
    is neither the oldest fetched (FIFO) nor the newest (MRU) and is the smallest (not
    largest-first), the second is not the smallest nor the least often used (LFU), the fourth
    skips the least recent one because it is in use. (A random choice passes 1 time in 200.)"""
    kib = 1 << 10
    sizes = {"i0": 1000, "i1": 900, "i2": 1100, "i3": 1050, "i4": 950, "i5": 1020, "j": 2000, "k": 1000}
    data = {name: os.urandom(size * kib) for name, size in sizes.items()}
    registry = Registry(**data)
    folder = tmp_path / "cache"
    cache = ImageCache(folder, max_bytes=4300 * kib)

    def use(*names):
        for name in names:
            get(cache, registry, data[name])

    def kept():
        return sorted(name for name, image in data.items() if (folder / sha(image)).exists())

    use("i0", "i1", "i2", "i3")  # 4050 KiB: nothing goes
    assert kept() == ["i0", "i1", "i2", "i3"]
    use("i0", "i2")  # least recently used first: i1 i3 i0 i2
    use("i4")  # 5000 KiB: i1 goes (FIFO would drop i0, MRU i2, largest-first i2)
    assert kept() == ["i0", "i2", "i3", "i4"]
    use("i3")  # i0 i2 i4 i3
    use("i5")  # 5120 KiB: i0 goes (smallest-first would drop i4, and so would LFU: i4 was used once)
    assert kept() == ["i2", "i3", "i4", "i5"]
    use("i2", "i4")  # i3 i5 i2 i4
    use("i1")  # fetched again: i3 goes
    assert kept() == ["i1", "i2", "i4", "i5"]
    with cache.use(sha(data["i5"])):  # i5 i2 i4 i1, the least recent being written to a device
        use("j")  # 5970 KiB: i2 and i4 go, to 3920 KiB; i5 stays
    assert kept() == ["i1", "i5", "j"]
    assert registry.fetches == 8, "a cached image is not fetched again, a dropped one is"

    cache = ImageCache(folder, max_bytes=4300 * kib)  # the exporter restarted: the order is on disk
    use("i1")  # i5 j i1
    use("k")  # 4920 KiB: i5 goes
    assert kept() == ["i1", "j", "k"]
    assert registry.fetches == 9
