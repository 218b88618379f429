"""GPU telemetry during a sweep or a kernel tune: an NVML sampler (pynvml), 1 Hz by default, up
to 10 Hz, and a pusher that hands its samples to the API in batches; and one reading of every
GPU on demand (`read_gpus_now`, the host page's "GPUs now").

One sample is one GPU at one instant, a dict with the fields of `runs.TelemetrySample`:

    gpu_index       int, the NVML index
    ts              UTC epoch s (float)
    level_concurrency  the concurrency of the level running when it was taken, or None
    gpu_util        % of time a kernel ran over the last sample period
    mem_util        % of time device memory was read or written
    power_w         W drawn;  power_limit_w  the enforced power limit, W
    mem_used_mib    MiB;      mem_total_mib  MiB
    sm_clock_mhz    MHz;      temperature_c  °C

A reading NVML does not support on a GPU is None. Without NVML there are no samples at all and
the sampler's `status` is "unavailable" with the reason in `detail`: numbers are never invented.

`python -m workers.telemetry --seconds 5 [--hz 1] [--gpus 0,1]` prints samples as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
import uuid

log = logging.getLogger(__name__)

MAX_HZ = 10.0
MIB = 2**20


class TelemetryUnavailable(Exception):
    """NVML cannot be used here; the message says why."""


def _load_nvml():
    try:
        import pynvml
    except ImportError as exc:
        raise TelemetryUnavailable(f"pynvml is not installed ({exc})") from None
    return pynvml


def open_gpus(nvml, gpu_indices=None):
    """Initialise NVML and return [(index, handle)] for gpu_indices (None: every GPU).

    Raises TelemetryUnavailable naming the reason (no driver, no such GPU, ...).
    """
    nvml_error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except nvml_error as exc:
        raise TelemetryUnavailable(f"NVML did not initialise: {exc}") from None
    try:
        count = nvml.nvmlDeviceGetCount()
        indices = list(range(count)) if gpu_indices is None else list(gpu_indices)
        if not indices:
            raise TelemetryUnavailable("NVML sees no GPU")
        missing = [i for i in indices if not 0 <= i < count]
        if missing:
            raise TelemetryUnavailable(f"GPU index {missing} not present: NVML sees {count} GPU(s)")
        return [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]
    except TelemetryUnavailable:
        nvml.nvmlShutdown()
        raise
    except nvml_error as exc:
        nvml.nvmlShutdown()
        raise TelemetryUnavailable(f"NVML could not open the GPUs: {exc}") from None


def read_sample(nvml, index, handle, *, ts, level_concurrency=None):
    """One reading of one GPU (see the module docstring for fields and units)."""
    nvml_error = getattr(nvml, "NVMLError", Exception)

    def read(fn, *args):
        try:
            return fn(handle, *args)
        except nvml_error:
            return None

    util = read(nvml.nvmlDeviceGetUtilizationRates)
    memory = read(nvml.nvmlDeviceGetMemoryInfo)
    power_mw = read(nvml.nvmlDeviceGetPowerUsage)
    limit_mw = read(nvml.nvmlDeviceGetEnforcedPowerLimit)
    sm_clock = read(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM)
    temperature = read(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU)
    return {
        "gpu_index": index,
        "ts": ts,
        "level_concurrency": level_concurrency,
        "gpu_util": None if util is None else float(util.gpu),
        "mem_util": None if util is None else float(util.memory),
        "power_w": None if power_mw is None else power_mw / 1000.0,
        "power_limit_w": None if limit_mw is None else limit_mw / 1000.0,
        "mem_used_mib": None if memory is None else memory.used / MIB,
        "mem_total_mib": None if memory is None else memory.total / MIB,
        "sm_clock_mhz": None if sm_clock is None else float(sm_clock),
        "temperature_c": None if temperature is None else float(temperature),
    }


# The API's limit for a run's telemetry_detail (characters).
DETAIL_LIMIT = 300


def read_gpus_now(nvml=None, *, clock=time.time):
    """Every GPU of this host read once: {"status": "recorded" | "unavailable", "detail" (why
    unavailable, at most DETAIL_LIMIT characters), "taken_at" (UTC epoch s), "gpus" (one
    read_sample dict per GPU)}. nvml: the pynvml module, or a stand-in (tests)."""
    taken_at = clock()
    try:
        nvml = nvml if nvml is not None else _load_nvml()
        gpus = open_gpus(nvml)
    except TelemetryUnavailable as exc:
        detail = str(exc)[:DETAIL_LIMIT]
        return {"status": "unavailable", "detail": detail, "taken_at": taken_at, "gpus": []}
    try:
        samples = [read_sample(nvml, index, handle, ts=taken_at) for index, handle in gpus]
    finally:
        nvml.nvmlShutdown()
    return {"status": "recorded", "detail": "", "taken_at": taken_at, "gpus": samples}


class TelemetrySampler:
    """Samples the given GPUs on a background thread until stopped.

    gpu_indices: NVML indices of the deployment's GPUs (None: all); hz: samples per second per
    GPU, 0 < hz <= 10; nvml: the pynvml module, or a stand-in with its functions (tests).
    Set `level_concurrency` while a level runs so that samples carry it. After `start()`,
    `status` is "recorded" or "unavailable" and `detail` says why when unavailable.
    """

    def __init__(self, gpu_indices=None, *, hz=1.0, nvml=None, clock=time.time):
        if not 0 < hz <= MAX_HZ:
            raise ValueError(f"hz must be in (0, {MAX_HZ}], got {hz}")
        self.gpu_indices = gpu_indices
        self.period = 1.0 / hz
        self.level_concurrency = None
        self.status = "pending"
        self.detail = ""
        self._nvml = nvml
        self._clock = clock
        self._gpus = []
        self._samples = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        try:
            if self._nvml is None:
                self._nvml = _load_nvml()
            self._gpus = open_gpus(self._nvml, self.gpu_indices)
        except TelemetryUnavailable as exc:
            # cut to what the API stores, so that a long driver message cannot get the run's
            # status push (sweep or tune) refused
            self.status, self.detail = "unavailable", str(exc)[:DETAIL_LIMIT]
            return self
        self.status = "recorded"
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def _loop(self):
        next_at = time.monotonic()
        while not self._stop.is_set():
            ts = self._clock()
            batch = [
                read_sample(self._nvml, i, h, ts=ts, level_concurrency=self.level_concurrency)
                for i, h in self._gpus
            ]
            with self._lock:
                self._samples.extend(batch)
            next_at += self.period
            # after a stall, skip the missed ticks rather than firing a burst
            next_at = max(next_at, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def drain(self):
        """The samples taken since the last drain, oldest first."""
        with self._lock:
            samples, self._samples = self._samples, []
        return samples

    def stop(self):
        """Stop sampling and release NVML; samples not drained yet stay available."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._nvml.nvmlShutdown()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def push_drained(sampler, post):
    """Post the samples taken since the last drain under a fresh batch id; returns how many.

    post: `post(samples, batch_id=…)`, e.g. a bound MoeopsClient.post_telemetry.
    """
    samples = sampler.drain()
    if samples:
        post(samples, batch_id=uuid.uuid4().hex)
    return len(samples)


class TelemetryPusher:
    """One sampler over gpu_indices whose samples are posted every interval_s from a thread,
    and the last ones when it stops (a context manager, like the sampler).

    post: as push_drained takes it. A failed post is logged and the work it watches goes on:
    telemetry is evidence about a load, never a reason to stop it.
    """

    def __init__(self, gpu_indices, post, *, hz=1.0, interval_s=5.0, nvml=None):
        self.sampler = TelemetrySampler(gpu_indices, hz=hz, nvml=nvml)
        self._post = post
        self._interval = interval_s
        self._halt = threading.Event()
        self._thread = None

    def _push(self):
        try:
            push_drained(self.sampler, self._post)
        except Exception:
            log.warning("pushing GPU telemetry failed", exc_info=True)

    def _loop(self):
        while not self._halt.wait(self._interval):
            self._push()

    def __enter__(self):
        self.sampler.start()
        if self.sampler.status == "recorded":
            self._thread = threading.Thread(target=self._loop, name="nvml-pusher", daemon=True)
            self._thread.start()
        else:
            log.info("no GPU telemetry: %s", self.sampler.detail)
        return self

    def __exit__(self, *exc):
        self._halt.set()
        if self._thread is not None:
            self._thread.join()
        self.sampler.stop()
        self._push()


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m workers.telemetry", description="Print NVML samples as JSON lines."
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--hz", type=float, default=1.0, help=f"samples/s, at most {MAX_HZ}")
    parser.add_argument("--gpus", help="comma-separated NVML indices (default: all)")
    args = parser.parse_args(argv)
    indices = [int(i) for i in args.gpus.split(",")] if args.gpus else None
    sampler = TelemetrySampler(indices, hz=args.hz).start()
    if sampler.status != "recorded":
        print(f"telemetry unavailable: {sampler.detail}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.seconds
    try:
        while time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            for sample in sampler.drain():
                print(json.dumps(sample), flush=True)
    finally:
        sampler.stop()
    for sample in sampler.drain():
        print(json.dumps(sample), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
