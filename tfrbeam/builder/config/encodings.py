"""The text encodings CSV input can be read in, and how bytes they cannot decode are marked."""

from __future__ import annotations

import codecs

__all__ = ["MARK_UNDECODABLE", "encoding_problem", "passes_through", "splittable_encoding"]


def splittable_encoding(encoding: str) -> bool:
    """Whether every line break and ASCII character is the same single byte as in ASCII."""
    name = codecs.lookup(encoding).name
    return name in ("utf-8", "utf-8-sig", "ascii", "latin-1", "iso8859-1") or name.startswith(("iso8859-", "cp125"))


MARK_UNDECODABLE = "tfrbeam-mark-undecodable"


def _mark_undecodable(error: UnicodeError) -> tuple[str, int]:
    """Decode each undecodable byte b as the lone surrogate U+DC00 + b.

    Valid text never decodes to a lone surrogate in the encodings read (encoding_problem refuses
    those that can), and its UTF-8 form (surrogatepass) is not valid UTF-8, so the row holding it
    is found when its batch is checked, and the byte can be named.
    """
    if not isinstance(error, UnicodeDecodeError):
        raise error
    return "".join(chr(0xDC00 + byte) for byte in error.object[error.start:error.end]), error.end


codecs.register_error(MARK_UNDECODABLE, _mark_undecodable)

# Codecs Python knows that decode valid input to lone surrogates (or decode nothing), so their
# rows cannot be checked: refused in the config.
_UNCHECKABLE_CODECS = ("utf-7", "unicode-escape", "raw-unicode-escape", "undefined")


def encoding_problem(encoding: str) -> str | None:
    """Why CSV text in this encoding cannot be read with every row checked, or None when it can."""
    try:
        info = codecs.lookup(encoding)
    except LookupError:
        return f"{encoding!r} is not an encoding Python knows (e.g. utf-8, latin-1, cp1252)"
    if not getattr(info, "_is_text_encoding", True):
        return f"{encoding!r} is not a text encoding (it maps bytes to bytes, or text to text)"
    if info.name in _UNCHECKABLE_CODECS:
        return (f"{encoding!r} can decode to lone surrogates, which UTF-8 cannot hold, so its rows cannot be "
                "checked; convert the file to UTF-8 first")
    return None


def passes_through(encoding: str) -> bool:
    return codecs.lookup(encoding).name in ("utf-8", "utf-8-sig", "ascii")
