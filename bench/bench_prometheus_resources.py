#!/usr/bin/env python3
"""What a real Prometheus (Debian's `prometheus`) costs for clusterwatch's series: memory, CPU, disk.

    .venv/bin/python bench/bench_prometheus_resources.py [--series 20000,100000] [--minutes 3,5] [--interval 15]

bench_vm_resources.py's shape, for the engine most deployments start with. One Prometheus on loopback,
its default flags but for the admin API (for the snapshot below), scrapes one target every `--interval`
seconds (the shipped prometheus.yml scrapes every 15 s): a static exposition this script serves, the
series of clusterwatch's shape (bench_vm_resources.py's: bench/cardinality.py's families at the default
settings, a node's 84.5 series) with values that move as a real cluster's do. Phase by phase the active
series grow (`--series`, each phase `--minutes` long); at the end of each: the process's resident memory
and CPU over the phase, and its head series (its own /metrics). At the very end, a TSDB snapshot with the
head (`/api/v1/admin/tsdb/snapshot`, which writes what the head holds as a block, compressed as a
two-hour block is) gives the bytes a sample and the index's bytes a series on disk. Derived and printed:

- memory an active series: the slope of resident memory between the phases (the first phase's level holds
  the process's fixed part), and the Go heap in use's slope (what the RSS follows, less the GC's slack);
- CPU a sample: CPU seconds over the phases / samples scraped;
- disk a series a day: the snapshot's chunk bytes / samples stored × samples a day at the interval, plus
  its index bytes a series (a two-hour block indexes each series again: 12 a day), and the WAL's bytes a
  sample (kept two to three hours, not a day).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_vm_resources import Values, folder_bytes, phase_args, series_of, vm_metric  # noqa: E402
from benchlib import table  # noqa: E402

from tests.services.procs import free_port, wait_http_ready  # noqa: E402

MiB = 1024 * 1024
#: Two-hour blocks a day: each one holds its own index of the series it has.
BLOCKS_A_DAY = 12


class Exposition:
    """The target: the first `count` series, their values moved once a scrape; counts the scrapes."""

    def __init__(self, names: list[tuple[str, str]]) -> None:
        self.names = names
        self.values = Values([k for _, k in names])
        self.count = 0
        self.scrapes = 0
        self.samples = 0
        self.lock = threading.Lock()

    def body(self) -> bytes:
        with self.lock:
            values = self.values.next()
            count = self.count
            self.scrapes += 1
            self.samples += count
        return "".join(f"{n} {v}\n" for (n, _), v in zip(self.names[:count], values[:count],
                                                          strict=True)).encode()


def serve(exposition: Exposition) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = exposition.body()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="exposition").start()
    return server


def main() -> None:
    phases, interval = phase_args(__doc__.splitlines()[0], "seconds between two scrapes", 0.1)
    binary = shutil.which("prometheus")
    if not binary:
        sys.exit("prometheus is not installed: apt-get install prometheus")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    names = series_of(max(s for s, _ in phases))
    exposition = Exposition(names)
    server = serve(exposition)
    tmp = tempfile.mkdtemp(prefix="cw-prom-")
    data = os.path.join(tmp, "data")
    conf = os.path.join(tmp, "prometheus.yml")
    with open(conf, "w") as f:  # JSON is YAML
        json.dump({"global": {"scrape_interval": f"{interval:g}s", "scrape_timeout": f"{interval:g}s"},
                   "scrape_configs": [{"job_name": "clusterwatch", "honor_labels": True,
                                       "static_configs": [{"targets": [f"127.0.0.1:{server.server_port}"]}]}]}, f)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(os.path.join(tmp, "prometheus.log"), "ab")
    prom = subprocess.Popen([binary, f"--config.file={conf}", f"--web.listen-address=127.0.0.1:{port}",
                             f"--storage.tsdb.path={data}", "--web.enable-admin-api",
                             f"--web.console.templates={tmp}", f"--web.console.libraries={tmp}"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp)
    try:
        wait_http_ready(prom, f"{url}/-/ready", "prometheus", lambda: "", 30)
        rows, cpu_total, wall_total = [], 0.0, 0.0
        rss0 = vm_metric(url, "process_resident_memory_bytes")
        heap0 = vm_metric(url, "go_memstats_heap_inuse_bytes")
        samples0 = 0
        for count, minutes in phases:
            with exposition.lock:
                exposition.count = count
                samples_before = exposition.samples
            cpu0, t0 = vm_metric(url, "process_cpu_seconds_total"), time.monotonic()
            time.sleep(minutes * 60)
            wall = time.monotonic() - t0
            cpu = vm_metric(url, "process_cpu_seconds_total") - cpu0
            rss = vm_metric(url, "process_resident_memory_bytes")
            heap = vm_metric(url, "go_memstats_heap_inuse_bytes")
            head = vm_metric(url, "prometheus_tsdb_head_series")
            with exposition.lock:
                scraped = exposition.samples - samples_before
            samples0 += scraped
            cpu_total, wall_total = cpu_total + cpu, wall_total + wall
            rows.append((count, minutes, head, rss, heap, cpu / wall, cpu / max(1, scraped)))
            print(f"phase: {count} series ({head:.0f} in the head), {scraped:,} samples in {wall:.0f} s: "
                  f"RSS {rss / MiB:.0f} MiB, heap {heap / MiB:.0f} MiB, {cpu / wall:.3f} cores, "
                  f"{cpu / max(1, scraped) * 1e6:.2f} µs CPU a sample", flush=True)
        req = urllib.request.Request(f"{url}/api/v1/admin/tsdb/snapshot", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=600) as r:
            name = json.loads(r.read())["data"]["name"]
        snap = os.path.join(data, "snapshots", name)
        chunks = index = 0
        for block in os.listdir(snap):
            chunks += folder_bytes(os.path.join(snap, block, "chunks"))
            path = os.path.join(snap, block, "index")
            index += os.path.getsize(path) if os.path.exists(path) else 0
        wal = folder_bytes(os.path.join(data, "wal"))
        stored = samples0
        per_sample = chunks / stored
        per_day = 86400 / interval
        top = rows[-1][0]
        if len(rows) > 1:
            slope = (rows[-1][3] - rows[0][3]) / (rows[-1][0] - rows[0][0])
            heap_slope = (rows[-1][4] - rows[0][4]) / (rows[-1][0] - rows[0][0])
        else:
            slope, heap_slope = (rows[0][3] - rss0) / top, (rows[0][4] - heap0) / top
        table_rows = [[f"{c:,}", f"{m:g}", f"{h:,.0f}", f"{r / MiB:.0f}", f"{hp / MiB:.0f}", f"{cores:.3f}",
                       f"{per * 1e6:.2f}"] for c, m, h, r, hp, cores, per in rows]
        notes = [
            f"{version}, default flags (+ admin API); a scrape every {interval:g} s; RSS with no series "
            f"{rss0 / MiB:.0f} MiB",
            f"memory: {slope:,.0f} B an active series (the RSS slope from {rows[0][0]:,} to {top:,} series), "
            f"{heap_slope:,.0f} B of Go heap in use",
            f"CPU: {cpu_total / stored * 1e6:.2f} µs a sample over all phases, {cpu_total / wall_total:.3f} cores "
            "on average",
            f"disk (a snapshot of the head as a block): chunks {chunks / MiB:.1f} MiB for {stored:,} samples "
            f"({per_sample:.2f} B a sample), index {index / MiB:.1f} MiB ({index / top:.0f} B a series); "
            f"WAL {wal / MiB:.1f} MiB ({wal / stored:.2f} B a sample, kept 2-3 h)",
            f"disk a series a day: {per_sample * per_day:,.0f} B of samples ({per_day:,.0f} samples) + "
            f"{index / top * BLOCKS_A_DAY:,.0f} B of index ({BLOCKS_A_DAY} two-hour blocks; compaction merges "
            "them into fewer)",
        ]
        print(table("Prometheus: memory, CPU and disk for clusterwatch's series",
                    ["active series", "minutes", "head series", "RSS MiB", "heap MiB", "cores", "µs CPU a sample"],
                    table_rows, notes), flush=True)
    finally:
        prom.terminate()
        try:
            prom.wait(30)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()
        server.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
