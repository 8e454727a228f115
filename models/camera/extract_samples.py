"""Extract the sample photographs in models/camera/samples/ from scikit-image's wheel.

    .venv/bin/python -m models.camera.extract_samples [--source-dir PATH/TO/skimage/data]

Only images whose docstring in `skimage/data/_fetchers.py` says public domain or CC0
are taken (scikit-image's own BSD licence covers its code, not these photographs).
Without --source-dir, scikit-image is pip-installed (--no-deps) into a temporary
directory; the files are read with Pillow, so skimage is never imported and the
runtime never needs it. Each image is re-encoded as a JPEG of modest quality.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "samples"
PACKAGE = "scikit-image"
VERSION = "0.26.0"
JPEG_QUALITY = 88


@dataclass(frozen=True)
class Sample:
    name: str  # output stem
    file: str  # file in skimage/data
    sha256: str  # of that file in scikit-image==0.26.0
    what: str
    licence: str  # as stated in skimage.data's docstring
    origin: str


SAMPLES: tuple[Sample, ...] = (
    Sample("astronaut", "astronaut.png",
           "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",
           "Eileen Collins, NASA astronaut (one frontal face)",
           "Public domain: \"No known copyright restrictions, released into the public domain.\"",
           "NASA Great Images database (flic.kr/p/r9qvLn)"),
    Sample("chelsea", "chelsea.png",
           "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb",
           "Chelsea the cat (no human face)",
           "CC0: \"No copyright restrictions. CC0 by the photographer (Stefan van der Walt).\"",
           "Stefan van der Walt"),
    Sample("coffee", "coffee.png",
           "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7",
           "Coffee cup on a table (no face)",
           "CC0: \"No copyright restrictions. CC0 by the photographer (Rachel Michetti).\"",
           "Rachel Michetti, courtesy of Pikolo Espresso Bar"),
    Sample("rocket", "rocket.jpg",
           "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c",
           "Falcon 9 / DSCOVR launch (outdoor scene, no face)",
           "Public domain: \"The image was captured by SpaceX and released in the public domain.\"",
           "SpaceX Photos (flickr.com/photos/spacexphotos/16511594820)"),
    Sample("camera", "camera.png",
           "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a",
           "a man filming with a tripod camera, grey-level (profile face; stands in for a monochrome camera)",
           "CC0: \"No copyright restrictions. CC0 by the photographer (Lav Varshney).\"",
           "Lav Varshney"),
)
# Left out on purpose: motorcycle_left/right (Middlebury stereo set, no licence stated in
# skimage), coins/immunohistochemistry ("no known copyright restrictions" but not
# photographs of scenes), and sklearn's china/flower (CC-BY, attribution required).


def install_source(target: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
         str(target), f"{PACKAGE}=={VERSION}"],
        check=True,
    )
    return target / "skimage" / "data"


def extract(sample: Sample, data_dir: Path) -> tuple[Path, tuple[int, int], str]:
    src = data_dir / sample.file
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    if digest != sample.sha256:
        raise SystemExit(f"{src}: sha256 {digest} is not the one checked for {PACKAGE}=={VERSION}")
    with Image.open(src) as im:
        im = im.convert("L" if im.mode in ("L", "1") else "RGB")
        out = OUT_DIR / f"{sample.name}.jpg"
        # optimize=True and no EXIF: the bytes depend only on the pixels and libjpeg.
        im.save(out, format="JPEG", quality=JPEG_QUALITY, optimize=True)
        return out, im.size, im.mode


def write_sources(rows: list[tuple[Sample, Path, tuple[int, int], str]]) -> None:
    lines = [
        "# Sample photographs",
        "",
        f"Extracted by `python -m models.camera.extract_samples` from the PyPI wheel "
        f"`{PACKAGE}=={VERSION}` (`skimage/data/`), re-encoded as JPEG quality {JPEG_QUALITY}.",
        "The licence of each photograph is the one stated in the docstring of its loader",
        "in `skimage/data/_fetchers.py`; only public-domain and CC0 images are kept.",
        "",
        "| file | size | what | licence | origin | source file (sha256) |",
        "|---|---|---|---|---|---|",
    ]
    for s, path, (w, h), mode in rows:
        lines.append(
            f"| {path.name} | {w}x{h} {mode} | {s.what} | {s.licence} | {s.origin} "
            f"| `skimage/data/{s.file}` (`{s.sha256[:16]}…`) |"
        )
    lines += [
        "",
        "Not taken: `motorcycle_left/right` (Middlebury stereo set, no licence stated),",
        "scikit-learn's `china.jpg`/`flower.jpg` (CC-BY: attribution required).",
        "",
    ]
    (OUT_DIR / "SOURCES.md").write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source-dir", type=Path, help="skimage/data of an installed wheel")
    args = parser.parse_args(argv)
    OUT_DIR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="skimage-") as tmp:
        data_dir = args.source_dir or install_source(Path(tmp))
        rows = [(s, *extract(s, data_dir)) for s in SAMPLES]
    write_sources(rows)
    total = sum(p.stat().st_size for _, p, _, _ in rows)
    print(f"wrote {len(rows)} samples ({total} bytes) and SOURCES.md to {OUT_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
