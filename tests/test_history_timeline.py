"""history/timeline and `elastic-ray session timeline`: PNG, SVG and HTML drawn for real, and the
HTML page opened in a real headless browser (Debian's chromium, installed by scripts/bootstrap).

Needs the timeline extra (matplotlib; scripts/bootstrap installs it). Under
CI=true a missing chromium fails the browser test instead of skipping it,
as a missing lab or mkdocs does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from elastic_ray.cli.main import main
from elastic_ray.config.session_file import SESSION_ENV
from elastic_ray.history.runs import build
from elastic_ray.history.timeline import TimelineError, output_format, render
from elastic_ray.protocol.disk import event_log
from tests.browser import near, need_chromium, png_colours, run_chromium
from tests.history_events import NOW, T0, K, ev, scenario, write_session

pytestmark = pytest.mark.timeout(180)
# In CI a missing extra fails the import below instead, except in scripts/matrix's virtualenvs,
# which leave the extra out on purpose (and say so).
if os.environ.get("CI") != "true" or os.environ.get("ELASTIC_RAY_MATRIX_WITHOUT") == "timeline":
    pytest.importorskip("matplotlib", reason="the timeline extra is not installed (pip install -e '.[timeline]')")
import matplotlib  # noqa: E402,F401 - the extra must be there (see above)

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "timeline-sample.png"
JOINED_BLUE = (0x3A, 0x86, 0xC8)


_session = write_session


_colours, _near = png_colours, near


# =============================================================== the format

@pytest.mark.parametrize("name, fmt", [("run.html", "html"), ("a/b/run.PNG", "png"), ("x.svg", "svg")])
def test_the_suffix_chooses_the_format(name, fmt):
    assert output_format(name) == fmt


@pytest.mark.parametrize("name", ["run.pdf", "run", "run.html.gz", "run.jpg"])
def test_a_suffix_that_names_no_format_is_an_error_naming_output(name):
    with pytest.raises(TimelineError, match=r"^output: .*must end in \.html, \.png or \.svg"):
        output_format(name)


# =============================================================== drawing

def test_png_and_svg_render_the_scenario():
    history = build(scenario(), NOW)
    png = render(history, "png")
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    colours = _colours(png)
    assert len(colours) > 50 and _near(colours, JOINED_BLUE)
    svg = render(history, "svg").decode()
    root = ET.fromstring(svg)                       # well-formed
    assert root.tag.endswith("svg")
    text = " ".join(t for t in root.itertext())
    for label in ("job 100 cpu01", "job 101 gpu01", "job 101 gpu02", "job 102 a01", "partition gpu-a",
                  "head 100", "elected 101", "payload train", "time (UTC)"):
        assert label in text, label


def test_the_html_page_is_self_contained():
    page = render(build(scenario(), NOW), "html", title="elastic-ray run s-1").decode()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<?xml" not in page
    assert "default-src 'none'" in page
    for fetch in ('href="http', "href='http", "src=", "<script", "<link", "<img", "@import", "url(http",
                  "<metadata"):
        assert fetch not in page, fetch
    for table in ('id="allocations"', 'id="usage"', 'id="events"', 'id="heads"', 'id="elections"',
                  'id="payloads"'):
        assert table in page
    assert "12.00" in page and "0.85" in page       # 101's and 102's GPU-hours


@pytest.mark.parametrize("events", [
    [], [ev(0, K.NODE_LEFT, "5", "n1")], [ev(0, K.HEAD_MOVED, "3", previous="2")],
    [ev(0, K.SUBMITTED, "9", role="worker")], [ev(0, K.PAYLOAD_STARTED, name="p")],
])
@pytest.mark.parametrize("fmt", ["png", "svg", "html"])
def test_thin_or_odd_histories_still_draw(events, fmt):
    assert render(build(events, T0 + 60), fmt)


# =============================================================== the command

def _invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, ["session", "timeline", *args], env=env, catch_exceptions=False)


@pytest.mark.parametrize("suffix, magic", [(".html", b"<!DOCTYPE html>"), (".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_the_command_writes_each_format(tmp_path, suffix, magic):
    session = _session(tmp_path, scenario(time.time() - 5600))
    output = tmp_path / f"run{suffix}"
    result = _invoke(str(session), "--output", str(output))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(output) and output.read_bytes().startswith(magic)


def test_the_command_s_json(tmp_path):
    session = _session(tmp_path, scenario())
    doc = json.loads(_invoke(str(session), "-o", str(tmp_path / "t.png"), "--json").stdout)
    assert doc["command"] == "session timeline" and doc["format"] == "png" and doc["events"] == len(scenario())
    assert doc["bytes"] == (tmp_path / "t.png").stat().st_size and doc["skipped_lines"] == 0
    bad = _invoke(str(session), "-o", str(tmp_path / "t.gif"), "--json")
    assert bad.exit_code == 2 and json.loads(bad.stdout)["error"]["type"] == "usage"


def test_the_session_may_come_from_the_environment(tmp_path):
    session = _session(tmp_path, scenario())
    result = _invoke("-o", str(tmp_path / "t.svg"), env={SESSION_ENV: str(session)})
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("case", ["bad suffix", "no such dir", "not a session", "no output dir", "no output"])
def test_bad_arguments_exit_2_and_write_nothing(tmp_path, case):
    session = _session(tmp_path, scenario())
    (tmp_path / "plain").mkdir()
    args = {"bad suffix": [str(session), "--output", str(tmp_path / "run.pdf")],
            "no such dir": [str(tmp_path / "gone"), "--output", str(tmp_path / "run.html")],
            "not a session": [str(tmp_path / "plain"), "--output", str(tmp_path / "run.html")],
            "no output dir": [str(session), "--output", str(tmp_path / "nope" / "run.html")],
            "no output": [str(session)]}[case]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = _invoke(*args)
    assert result.exit_code == 2, result.output
    message = {"bad suffix": "Invalid value for --output: '", "no such dir": "no such directory",
               "not a session": "not a session directory", "no output dir": "does not exist",
               "no output": "Missing option '--output'"}[case]
    assert message in result.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("command", [["timeline", "-o", "run.html"], ["usage"]])
def test_without_dir_or_env_the_commands_say_so(command, monkeypatch):
    monkeypatch.delenv(SESSION_ENV, raising=False)
    result = CliRunner().invoke(main, ["session", *command])
    assert result.exit_code == 2 and "no session directory given" in result.stderr


BLOCK_MATPLOTLIB = r'''
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "matplotlib":
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
from elastic_ray.cli.main import main
sys.argv = ["elastic-ray", "session", *sys.argv[1:]]
main()
'''


def test_without_matplotlib_usage_works_and_timeline_says_what_to_install(tmp_path):
    session = _session(tmp_path, scenario())
    run = lambda *args: subprocess.run([sys.executable, "-c", BLOCK_MATPLOTLIB, *args],  # noqa: E731
                                       capture_output=True, text=True, timeout=120, cwd=REPO)
    usage = run("usage", str(session))
    assert usage.returncode == 0 and "GPU-hours held" in usage.stdout, usage.stderr
    timeline = run("timeline", str(session), "-o", str(tmp_path / "run.html"))
    assert timeline.returncode == 1, timeline.stderr
    assert "pip install 'elastic-ray[timeline]'" in timeline.stderr and "Traceback" not in timeline.stderr
    assert not (tmp_path / "run.html").exists()


# =============================================================== a real browser

_chromium = run_chromium


@pytest.fixture
def chromium():
    return need_chromium()


def test_the_page_in_a_real_headless_browser(tmp_path, chromium):
    """A run written by real appends, drawn by the command, opened by chromium: the DOM has every
    allocation and the usage table, and the screenshot shows the drawing."""
    session = _session(tmp_path, scenario(time.time() - 5600))
    page = tmp_path / "run.html"
    result = _invoke(str(session), "--output", str(page))
    assert result.exit_code == 0, result.output

    dom = _chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr.decode()[-2000:]
    text = dom.stdout.decode()
    assert '<table id="allocations">' in text and '<table id="usage">' in text and "<svg" in text
    allocations = text.split('<table id="allocations">', 1)[1].split("</table>", 1)[0]
    usage = text.split('<table id="usage">', 1)[1].split("</table>", 1)[0]
    for job in ("100", "101", "102"):
        assert f"<td>{job}</td>" in allocations and f"<td>{job}</td>" in usage, job
    for heading in ("node-hours", "GPU-hours held", "GPU-hours idle"):
        assert f"<th>{heading}</th>" in usage
    assert '<tr class="total"><td>run</td>' in usage
    assert "job 101 gpu02" in text and "election_won" in text

    shot = tmp_path / "shot.png"
    taken = _chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,900", page.as_uri())
    assert taken.returncode == 0 and shot.exists(), taken.stderr.decode()[-2000:]
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 30_000
    colours = _colours(png)
    assert len(colours) > 100, f"only {len(colours)} colours: a blank page?"
    assert _near(colours, JOINED_BLUE), "the joined bars' blue is not on the screenshot"
    if os.environ.get("ELASTIC_RAY_TIMELINE_SAMPLE"):       # a developer's look at it: not in CI
        shutil.copyfile(shot, SAMPLE)
