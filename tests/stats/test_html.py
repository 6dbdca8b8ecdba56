"""stats.html in a real browser: headless Chromium (Debian's ``chromium``) loads the page offline and screenshots it."""

from __future__ import annotations

import html.parser
import json
import pathlib
import shutil
import struct
import subprocess
import tempfile
import zlib

import numpy as np
import pytest

from tests.example_builds import build_examples
from tfrbeam.stats.compute import write_dataset_stats
from tfrbeam.stats.html import presence_bar, render_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH: install Debian's package (apt-get install chromium); .ci/run does"
)


def chromium(*arguments: str) -> subprocess.CompletedProcess:
    """Run headless Chromium with no network services and a throwaway profile; stops when the page is done."""
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             "--window-size=1280,2000", *arguments],
            capture_output=True, timeout=120, check=True,
        )


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory) -> pathlib.Path:
    """The demo build (configs/demo.yaml) with its stats.json and stats.html."""
    dataset = build_examples(tmp_path_factory.mktemp("report"), "demo.yaml")["demo"]
    write_dataset_stats(str(dataset))
    return dataset


class _Dom(html.parser.HTMLParser):
    """Feature rows per split section, and the histogram SVGs with their bars, of a serialised DOM."""

    def __init__(self):
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self.histograms: list[int] = []
        self.external: list[str] = []
        self._split: str | None = None
        self._in_histogram = False

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        if tag == "section" and "split" in classes:
            self._split = attributes["data-split"]
            self.rows[self._split] = []
        elif tag == "tr" and "feature-row" in classes and self._split is not None:
            self.rows[self._split].append(attributes["data-feature"])
        elif tag == "svg" and "hist" in classes:
            self.histograms.append(0)
            self._in_histogram = True
        elif tag == "rect" and self._in_histogram:
            self.histograms[-1] += 1
        for name in ("src", "href"):
            if attributes.get(name):
                self.external.append(attributes[name])
        if tag in ("script", "link", "img", "iframe"):
            self.external.append(tag)

    def handle_endtag(self, tag):
        if tag == "svg":
            self._in_histogram = False


def read_png(path: pathlib.Path) -> np.ndarray:
    """Decode an 8-bit RGB(A), non-interlaced PNG into a (height, width, channels) uint8 array (zlib + numpy)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks = 8, []
    while position < len(data):
        (length,) = struct.unpack(">I", data[position:position + 4])
        kind, body = data[position + 4:position + 8], data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
        elif kind == b"IDAT":
            chunks.append(body)
        position += 12 + length
    channels = 3 if color == 2 else 4
    stride = width * channels
    raw = np.frombuffer(zlib.decompress(b"".join(chunks)), dtype=np.uint8).reshape(height, stride + 1)
    image = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.uint8)
    for row in range(height):
        kind, line = raw[row, 0], raw[row, 1:]
        if kind == 0:
            current = line.copy()
        elif kind == 1:  # Sub: a running sum per channel
            current = np.cumsum(line.reshape(width, channels), axis=0, dtype=np.uint8).reshape(stride)
        elif kind == 2:  # Up
            current = line + previous
        else:
            current = _sequential_filter(kind, line, previous, channels)
        image[row] = current
        previous = current
    return image.reshape(height, width, channels)


def _sequential_filter(kind: int, line: np.ndarray, previous: np.ndarray, channels: int) -> np.ndarray:
    out = bytearray(len(line))
    up = previous.tolist()
    filtered = line.tolist()
    for index, value in enumerate(filtered):
        left = out[index - channels] if index >= channels else 0
        above = up[index]
        if kind == 3:  # Average
            out[index] = (value + (left + above) // 2) & 0xFF
        else:  # Paeth
            corner = up[index - channels] if index >= channels else 0
            estimate = left + above - corner
            pa, pb, pc = abs(estimate - left), abs(estimate - above), abs(estimate - corner)
            predictor = left if pa <= pb and pa <= pc else above if pb <= pc else corner
            out[index] = (value + predictor) & 0xFF
    return np.frombuffer(bytes(out), dtype=np.uint8)


def test_png_reader_decodes_every_filter_type(tmp_path):
    """The test's own PNG decoder against known pixels written with each of the five filter types."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)
    rows = []
    previous = np.zeros(12, dtype=np.int64)
    for kind in range(5):
        line = pixels[kind].reshape(12).astype(np.int64)
        left = np.concatenate(([0, 0, 0], line[:-3]))
        corner = np.concatenate(([0, 0, 0], previous[:-3]))
        if kind == 0:
            filtered = line
        elif kind == 1:
            filtered = line - left
        elif kind == 2:
            filtered = line - previous
        elif kind == 3:
            filtered = line - (left + previous) // 2
        else:
            estimate = left + previous - corner
            pa, pb, pc = abs(estimate - left), abs(estimate - previous), abs(estimate - corner)
            filtered = line - np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, previous, corner))
        rows.append(bytes([kind]) + bytes((filtered % 256).astype(np.uint8)))
        previous = line

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 5, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b""))
    (tmp_path / "t.png").write_bytes(png)
    assert np.array_equal(read_png(tmp_path / "t.png"), pixels)


@needs_browser
def test_report_renders_offline_with_one_row_per_feature_and_svg_histograms(demo_report, tmp_path):
    page = demo_report / "stats.html"
    manifest = json.loads((demo_report / "tfrbeam_dataset.json").read_text())
    features = list(manifest["features"])  # the source's column order, as the manifest keeps it
    dom = _Dom()
    dom.feed(chromium("--dump-dom", page.as_uri()).stdout.decode("utf-8"))
    assert dom.rows == dict.fromkeys(manifest["splits"], features)
    numeric = [name for name, entry in manifest["features"].items() if entry["type"] != "bytes"]
    assert len(dom.histograms) == 2 * len(numeric) * len(manifest["splits"])  # equal-width and decile histograms
    assert all(bars >= 1 for bars in dom.histograms) and max(dom.histograms) == 20
    assert dom.external == []  # nothing to fetch: no script, stylesheet, image or link
    shot = tmp_path / "shot.png"
    chromium(f"--screenshot={shot}", page.as_uri())
    image = read_png(shot)
    assert image.shape[:2] == (2000, 1280)
    rgb = image[..., :3].astype(np.int64)
    background = np.all(rgb == rgb[0, 0], axis=-1).mean()
    assert rgb.std() > 10 and background < 0.95  # not blank
    colours = len(np.unique(rgb.reshape(-1, 3) // 16, axis=0))
    assert colours > 20
    bar_blue = np.all(np.abs(rgb - np.array([0x3B, 0x6F, 0xD8])) < 12, axis=-1).sum()
    assert bar_blue > 500  # the histogram bars were drawn


def test_presence_bar_is_never_full_unless_every_example_has_the_feature():
    assert 'width="119"' in presence_bar(26_111, 26_115) and "99.98%" in presence_bar(26_111, 26_115)
    assert 'width="120" height="10" fill="#2e8b57"' in presence_bar(5, 5)
    assert 'width="1" height="10" fill="#2e8b57"' in presence_bar(1, 10**6)


def test_report_escapes_feature_names_and_values():
    stats = {"splits": {"s": {"num_examples": 1, "features": {"<b>x</b>": {
        "type": "bytes", "shape": [], "present": 1, "values_per_example": {"min": 1, "max": 1, "mean": 1.0},
        "histogram": None, "top_values": [{"value": "<script>", "count": 1}], "top_values_exact": True,
        "num_unique": 1, "num_unique_estimated": False, "length": {"min": 8, "max": 8, "mean": 8.0},
    }}}}, "drift": {}}
    page = render_html(stats, title="t")
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;x&lt;/b&gt;" in page


_PAYLOAD = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"


def _poisoned(value, keep=("type", "method")):
    """Every string value of a stats tree with a script payload appended; the kinds the layout branches on stay."""
    if isinstance(value, dict):
        return {key: (item if key in keep else _poisoned(item, keep)) for key, item in value.items()}
    if isinstance(value, list):
        return [_poisoned(item, keep) for item in value]
    return value + _PAYLOAD if isinstance(value, str) else value


def _renamed(mapping: dict) -> dict:
    """The same entries under names carrying the payload (split and feature names come from the manifest)."""
    return {name + _PAYLOAD: entry for name, entry in mapping.items()}


class _Scripts(html.parser.HTMLParser):
    """Counts the script elements and event-handler attributes of a serialised DOM."""

    def __init__(self):
        super().__init__()
        self.active: list[str] = []
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        self._in_title = tag == "title"
        if tag == "script" or any(name.startswith("on") for name, _ in attrs):
            self.active.append(tag)

    def handle_data(self, data):
        if self._in_title:
            self.title += data

    def handle_endtag(self, tag):
        self._in_title = False


@needs_browser
def test_no_string_of_the_stats_or_manifest_runs_in_the_browser(demo_report, tmp_path):
    stats = json.loads((demo_report / "stats.json").read_text())
    manifest_shapes = {name: entry.get("shape") for name, entry in
                       json.loads((demo_report / "tfrbeam_dataset.json").read_text())["features"].items()}
    assert manifest_shapes
    poisoned = _poisoned(stats)
    poisoned["splits"] = _renamed(poisoned["splits"])
    for split in poisoned["splits"].values():
        split["features"] = _renamed(split["features"])
        for feature in split["features"].values():
            feature["shape"] = [_PAYLOAD]  # a manifest's shape reached the page raw
    page = tmp_path / "stats.html"
    page.write_text(render_html(poisoned, title=_PAYLOAD), encoding="utf-8")
    dom = _Scripts()
    dom.feed(chromium("--dump-dom", page.as_uri()).stdout.decode("utf-8"))
    assert dom.active == []
    assert "pwned" != dom.title.strip()
