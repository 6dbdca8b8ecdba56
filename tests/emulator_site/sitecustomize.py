"""Test-only start-up hook for processes the storage fixtures start against a GCS emulator (on their PYTHONPATH).

Beam's GCS IO ignores ``--no_auth``: a process without Google credentials asks ``google.auth.default()``
five times with backoff from 2 s (20-30 s) before it connects anonymously, as it then does against
the emulator. Every build a test starts would sit there. This hook, not tfrbeam (which uses no
Beam private API), asks once and, finding no credentials, puts Beam's own eventual answer (None:
anonymous) in Beam's per-process cache. If Beam's internals change it does nothing, and the tests
are only slower.
"""

from __future__ import annotations

import os


def prime_beam_credentials_for_emulator() -> None:
    """Under STORAGE_EMULATOR_HOST with no Google credentials: Beam's credential cache says "anonymous" at once."""
    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        return
    try:
        import google.auth
        import google.auth.exceptions
        from apache_beam.internal.gcp import auth
    except ImportError:
        return
    cache = getattr(auth, "_Credentials", None)
    if cache is None or not hasattr(cache, "_credentials_init") or not hasattr(cache, "_credentials_lock"):
        return
    with cache._credentials_lock:
        if cache._credentials_init:
            return
        try:
            google.auth.default()
            return
        except google.auth.exceptions.DefaultCredentialsError:
            cache._credentials, cache._credentials_init = None, True


prime_beam_credentials_for_emulator()
