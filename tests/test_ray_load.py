"""Reading a node's GPU load from Ray's metrics page, and integrating it: tables; one real HTTP read."""

from __future__ import annotations

import http.server
import threading

import pytest

from elastic_ray.agent.node.ray_load import GpuLoad, GpuSampler, UsageMeter, parse_gpu_load, read_gpu_load
from elastic_ray.protocol.disk.records import GpuUsage

# The shape Ray 2.60's metrics agent prints (labels trimmed to what matters and one extra).
L = 'ray_resources{{Component="{c}",Name="{n}",NodeAddress="10.0.0.7",State="{s}",Version="2.60.0"}} {v}'


def page(*rows: tuple[str, str, str, str]) -> str:
    return "\n".join(["# HELP ray_resources Logical resources", "# TYPE ray_resources gauge",
                      *(L.format(c=c, n=n, s=s, v=v) for c, n, s, v in rows), "ray_other_metric 3"])


@pytest.mark.parametrize("text, load", [
    (page(("raylet", "GPU", "USED", "1.0"), ("raylet", "GPU", "AVAILABLE", "3.0"),
          ("raylet", "CPU", "USED", "7.0")), GpuLoad(1.0, 3.0)),
    (page(("raylet", "GPU", "AVAILABLE", "2.0")), GpuLoad(0.0, 2.0)),            # nothing used yet
    (page(("raylet", "GPU", "USED", "0.5"), ("raylet", "GPU", "AVAILABLE", "1.5e+00")), GpuLoad(0.5, 1.5)),
    (page(("raylet", "CPU", "USED", "1.0")), None),                               # a node without GPUs
    (page(("gcs", "GPU", "USED", "4.0"), ("raylet", "GPU", "AVAILABLE", "1")), GpuLoad(0.0, 1.0)),  # not the raylet's
    (page(("raylet", "GPU", "USED", "NaN"), ("raylet", "GPU", "AVAILABLE", "2")), GpuLoad(0.0, 2.0)),
    ("", None),
    ("<html>not metrics</html>", None),
])
def test_the_gpu_lines_of_a_metrics_page(text, load):
    assert parse_gpu_load(text) == load


@pytest.mark.parametrize("looks, held, idle, samples", [
    ([(0, GpuLoad(0, 2))], 0.0, 0.0, 1),                                       # the first look only starts the count
    ([(0, GpuLoad(0, 2)), (60, GpuLoad(0, 2))], 120.0, 120.0, 2),
    ([(0, GpuLoad(0, 2)), (60, GpuLoad(1, 1)), (120, GpuLoad(2, 0))], 240.0, 60.0, 3),
    ([(0, GpuLoad(0, 4)), (60, None), (120, GpuLoad(0, 4))], 0.0, 0.0, 2),    # a gap is not counted
    ([(0, GpuLoad(0, 4)), (200, GpuLoad(0, 4))], 0.0, 0.0, 2),                # too long since the last look
    ([(0, GpuLoad(0, 4)), (150, GpuLoad(1, 3))], 600.0, 450.0, 2),            # 2.5 intervals: still counted
    ([(0, GpuLoad(0, 1)), (0, GpuLoad(0, 1))], 0.0, 0.0, 2),                  # no time passed
])
def test_the_meter_integrates_looks(looks, held, idle, samples):
    meter = UsageMeter(interval=60)
    for at, load in looks:
        meter = meter.add(at, load)
    assert (meter.usage.held_gpu_seconds, meter.usage.idle_gpu_seconds, meter.usage.samples) == (held, idle, samples)


def test_usage_round_trips_and_refuses_idle_above_held():
    usage = GpuUsage(7200.0, 1800.0, 121, 10.0, 7210.0)
    assert GpuUsage.from_dict(usage.to_dict()) == usage
    with pytest.raises(ValueError, match="idle"):
        GpuUsage.from_dict({**usage.to_dict(), "idle_gpu_seconds": 9000.0})


def test_a_sampler_reads_a_real_http_page_and_counts_nothing_without_a_port():
    body = page(("raylet", "GPU", "USED", "1"), ("raylet", "GPU", "AVAILABLE", "1")).encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        assert read_gpu_load(port) == GpuLoad(1.0, 1.0)
        clock = iter([100.0, 110.0, 120.0])
        joined = {"port": port}
        sampler = GpuSampler(lambda: joined["port"], interval=10, clock=lambda: next(clock))
        assert sampler.usage() is None
        sampler.look()
        sampler.look()
        assert sampler.usage() == GpuUsage(20.0, 10.0, 2, 100.0, 110.0)
        joined["port"] = None                  # left the run: a gap, nothing counted
        sampler.look()
        assert sampler.usage() == GpuUsage(20.0, 10.0, 2, 100.0, 110.0)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert read_gpu_load(port, timeout=0.5) is None     # nothing listens any more
