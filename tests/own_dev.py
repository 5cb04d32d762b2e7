"""A process that holds a node of its own /dev, as a process in a rootful container does: in
a mount namespace of its own (unshare), with a tmpfs on /dev and a node made there by
mknod, of the numbers asked for. Its fd's link is ``/dev/...``, its file is not the host's."""
from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

HOLD = "import sys, time; f = open(sys.argv[1], 'rb+', buffering=0); print('held', flush=True); time.sleep(600)"


@contextlib.contextmanager
def held_in_its_own_dev(path: str, major: int, minor: int) -> Iterator[subprocess.Popen]:
    """A process (its Popen) that holds ``path`` (``/dev/...``), a character node of
    ``major``:``minor`` in a /dev of its own, until the block ends."""
    folder = path.rsplit("/", 1)[0]
    script = (f"mount -t tmpfs device-loop-test /dev && mkdir -p {folder} && mknod -m 600 {path} c {major} {minor} "
              f'&& exec {sys.executable} -c "$0" {path}')
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, HOLD],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        said = holder.stdout.readline() if holder.stdout else b""
        assert said == b"held\n", holder.stderr.read() if holder.stderr and holder.poll() is not None else said
        yield holder
    finally:
        holder.kill()
        holder.wait()
