"""Running the flashes the coordinator hands this host (DESIGN §6).

Each flash runs in a thread of its own, beside the report loop (heartbeats keep flowing
during a long flash): fetch the image into the cache (verified), then hand it to the
flash target's plugin (``devloop_flash``), which writes and verifies it. Every report
says how each flash goes, until a report carrying its result was answered.

A flash is begun once per start of the exporter and never again, whatever desired
states say later. Before the first byte is written a marker is left on disk, and kept
until the flash's result was acknowledged: if the exporter dies while writing, its next
start reports that flash as interrupted while writing, and the coordinator marks the
device as needing recovery.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable, Iterator

from device_loop.core import WRITING_PHASES
from device_loop.core.files import write_atomically
from device_loop.core.host import HostContext
from device_loop.core.model import FlashError, FlashImage, Resource
from device_loop.core.plugins import PluginSet
from device_loop.core.protocol import DesiredFlash, FlashReport

from .image_cache import ImageCache

log = logging.getLogger("device_loop.exporter")
PROGRESS_EVERY_S = 0.5  # a report for progress alone, at most this often


class FlashJob:
    def __init__(self, op: str, device: str, phase: str = "fetching", state: str = "running", message: str = ""):
        self.op, self.device = op, device
        self.state, self.phase, self.done_bytes, self.message = state, phase, 0, message
        self.thread: threading.Thread | None = None
        self.changed = phase != "fetching"  # the target may have been changed
        self.seconds: dict[str, float] = {}  # phase -> how long it took (the current one: so far)
        self._phase_began = time.monotonic()

    def enter(self, phase: str) -> None:
        self.clock()
        self.phase, self._phase_began = phase, time.monotonic()

    def clock(self) -> None:
        self.seconds[self.phase] = time.monotonic() - self._phase_began

    def report(self) -> FlashReport:
        if self.state == "running":
            self.clock()
        return FlashReport(op=self.op, device=self.device, state=self.state, phase=self.phase,
                           done_bytes=self.done_bytes, message=self.message, seconds=dict(self.seconds),
                           changed=self.changed)


class Flasher:
    def __init__(self, host: HostContext, plugins: PluginSet, cache: ImageCache,
                 fetch: Callable[[str], Iterator[bytes]], on_change: Callable[[], None]):
        self.host, self.plugins, self.cache, self.fetch = host, plugins, cache, fetch
        self.on_change = on_change
        self.markers = host.state_dir / "flashing"
        self.jobs: dict[str, FlashJob] = {}
        self._begun: set[str] = set()
        self._lock = threading.Lock()
        self._last_progress = 0.0
        for job in self._interrupted():
            self.jobs[job.op] = job
            self._begun.add(job.op)

    def _interrupted(self) -> list[FlashJob]:
        """The flashes an earlier start of this exporter was writing when it died."""
        jobs = []
        for path in sorted(self.markers.glob("*.json")):
            try:
                mark = json.loads(path.read_text())
            except (OSError, ValueError):
                path.unlink(missing_ok=True)
                continue
            if mark["state"] == "running":
                log.error("flash %s of %s was interrupted while %s: the exporter stopped", mark["op"], mark["device"],
                          mark["phase"])
                mark |= {"state": "failed", "message": f"interrupted while {mark['phase']}: the exporter stopped "
                                                       "(the target may be half-written)"}
            job = FlashJob(mark["op"], mark["device"], mark["phase"], mark["state"], mark["message"])
            job.changed = mark.get("changed", True)
            jobs.append(job)
        return jobs

    def converge(self, desired: list[DesiredFlash], resources: list[Resource]) -> None:
        """Begin the flashes not begun yet (each once per start of the exporter)."""
        by_identifier = {r.identifier: r for r in resources}
        with self._lock:
            for flash in desired:
                if flash.op in self._begun:
                    continue
                self._begun.add(flash.op)
                job = self.jobs[flash.op] = FlashJob(flash.op, flash.device)
                job.thread = threading.Thread(target=self._run, args=(job, flash, by_identifier.get(flash.identifier)),
                                              name=f"flash-{flash.device}", daemon=True)
                job.thread.start()
        if desired:
            self.on_change()

    def reports(self) -> list[FlashReport]:
        with self._lock:
            return [job.report() for job in self.jobs.values()]

    def acknowledged(self, sent: list[FlashReport]) -> None:
        """A report carrying ``sent`` was answered: the results in it are the coordinator's now."""
        with self._lock:
            for report in sent:
                if report.state != "running" and report.op in self.jobs:
                    del self.jobs[report.op]
                    (self.markers / f"{report.op}.json").unlink(missing_ok=True)

    def running(self) -> list[FlashJob]:
        with self._lock:
            return [job for job in self.jobs.values() if job.state == "running"]

    def wait(self, timeout: float) -> bool:
        """Wait until no flash runs; False if one still does after ``timeout``."""
        deadline = time.monotonic() + timeout
        for job in self.running():
            if job.thread is not None:
                job.thread.join(max(0.0, deadline - time.monotonic()))
        return not self.running()

    # ---- one flash ------------------------------------------------------------------------

    def _progress(self, job: FlashJob, phase: str, done_bytes: int) -> None:
        changed = phase != job.phase
        if changed:
            job.enter(phase)
            job.changed = job.changed or phase != "fetching"
        job.done_bytes = done_bytes
        if changed and phase != "fetching":
            self._mark(job)
        now = time.monotonic()
        if changed or now - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = now
            self.on_change()

    def _backend_progress(self, job: FlashJob, phase: str, done_bytes: int) -> None:
        """What a plugin says of its progress, in the protocol's terms whatever it passes."""
        self._progress(job, phase if phase in WRITING_PHASES else "writing", max(0, int(done_bytes)))

    def _run(self, job: FlashJob, flash: DesiredFlash, resource: Resource | None) -> None:
        try:
            if resource is None:
                raise FlashError(f"the flash target {flash.identifier} is not on this host any more")
            if not self.plugins.implements(resource.plugin, "devloop_flash"):
                raise FlashError(f"plugin {resource.plugin!r} cannot flash (it is not loaded here, or has no "
                                 "devloop_flash hook)")
            with self.cache.use(flash.sha256):
                path = self.cache.get(flash.sha256, flash.size, lambda: self.fetch(flash.sha256),
                                      lambda done: self._progress(job, "fetching", done))
                image = FlashImage(path=path, sha256=flash.sha256, size=flash.size, name=flash.image)
                self._progress(job, "writing", 0)  # from here on, the target may be changed
                said = self.plugins.call(resource.plugin, "devloop_flash", host=self.host, resource=resource,
                                         image=image, progress=lambda phase, done: self._backend_progress(job, phase,
                                                                                                          done))
            job.message, job.state = said or "written", "done"
            log.info("flash %s of %s with %s: done (%s); %s", job.op, job.device, flash.image, job.message,
                     ", ".join(f"{phase} {seconds:.2f}s" for phase, seconds in job.seconds.items()))
        except FlashError as exc:
            job.changed = job.changed and exc.changed
            job.message, job.state = str(exc), "failed"
            log.error("flash %s of %s with %s failed while %s: %s", job.op, job.device, flash.image, job.phase, exc)
        except Exception as exc:  # a plugin's bug is this flash's failure, not the exporter's
            log.exception("flash %s of %s crashed", job.op, job.device)
            job.message, job.state = f"the flash backend crashed: {exc!r}", "failed"
        job.clock()
        if job.phase != "fetching":
            self._mark(job)
        self.on_change()

    def _mark(self, job: FlashJob) -> None:
        """Where a flash that changes its target stands, on disk until its result was
        acknowledged: a next start reports it (as interrupted, if it was still running)."""
        self.markers.mkdir(parents=True, exist_ok=True)
        write_atomically(self.markers / f"{job.op}.json", json.dumps(
            {"op": job.op, "device": job.device, "state": job.state, "phase": job.phase, "message": job.message,
             "changed": job.changed}))
