"""Headless Chromium renders GET /docs: a screenshot, and the rendered DOM.

Starts the built host, then has Chromium load /docs with every host name but
127.0.0.1 unresolvable, so a page that needed a CDN would come out unstyled.
Checks, from the screenshot (decoded here, no imaging library): its size, that
it is not blank, that the navigation column has the page's own background
colour (the inline stylesheet applied) and that it has text-like detail; from
the DOM: the title and one entry per OpenAPI path. The PNG is kept at
target/docs-screenshot.png. Run by .ci/run.
"""
import json
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile
import urllib.request
import zlib

from service import TARGET, running

WIDTH, HEIGHT = 1280, 1000
NAV_BACKGROUND = (0xF5, 0xF5, 0xF7)  # nav{background:#f5f5f7} in the page's CSS


def chromium():
    for name in ["chromium", "chromium-browser", "google-chrome", "chrome"]:
        path = shutil.which(name)
        if path:
            return path
    sys.exit("docs screenshot: no Chromium found (apt-get install chromium)")


def browse(url, *args):
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--no-first-run", "--disable-extensions", "--disable-dev-shm-usage",
           "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
           f"--window-size={WIDTH},{HEIGHT}", *args, url]
    with tempfile.TemporaryDirectory() as profile:
        cmd.insert(1, f"--user-data-dir={profile}")
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def decode_png(data):
    """(width, height, rows of (r, g, b)) of an 8-bit RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(height):
        kind, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if kind == 1:
                line[x] = (line[x] + a) & 255
            elif kind == 2:
                line[x] = (line[x] + b) & 255
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, bpp)])
        prev = line
    return width, height, rows


def check(base):
    out = TARGET / "docs-screenshot.png"
    out.unlink(missing_ok=True)
    run = browse(base + "/docs", f"--screenshot={out}")
    assert out.is_file(), f"no screenshot: {run.stderr[-2000:]}"
    width, height, rows = decode_png(out.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT), (width, height)

    pixels = [p for row in rows for p in row]
    white = sum(1 for p in pixels if p == (255, 255, 255))
    colours = len(set(pixels))
    nav = [p for row in rows[50:] for p in row[20:300]]
    nav_share = sum(1 for p in nav if p == NAV_BACKGROUND) / len(nav)
    main = [p for row in rows[:400] for p in row[400:1200]]
    ink = sum(1 for p in main if sum(p) < 3 * 128) / len(main)
    assert white < 0.97 * len(pixels), "the page rendered blank"
    assert colours > 20, f"only {colours} colours: no text rendered"
    assert nav_share > 0.5, f"navigation background in {nav_share:.0%} of its column: CSS not applied"
    assert ink > 0.005, f"{ink:.2%} dark pixels in the main column: no text"

    dom = browse(base + "/docs", "--dump-dom").stdout
    assert "Marketplace API reference" in dom, dom[:500]
    spec = json.loads(urllib.request.urlopen(base + "/openapi.json").read())
    missing = [p for p in spec["paths"] if p not in dom]
    assert not missing, f"paths not in the rendered page: {missing}"
    print(f"docs screenshot: {width}x{height}, {colours} colours, nav background {nav_share:.0%}, "
          f"text {ink:.1%} of the main column, {len(spec['paths'])} paths in the DOM; saved {out}")


with running() as base:
    check(base)
