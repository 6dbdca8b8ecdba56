"""Test-only start-up hook for processes the storage fixtures start against a GCS emulator (on their PYTHONPATH).

Beam's GCS IO ignores ``--no_auth``: a process without Google credentials asks ``google.auth.default()``
five times with backoff from 2 s (20-30 s) before it connects anonymously, as it then does against
the emulator. Every build a test starts would sit there. This hook, not tfrbeam (which uses no
Beam private API), waits for Beam's auth module to be imported (never importing Beam itself: the
training reader must run without it) and then asks once; finding no credentials, it puts Beam's own
eventual answer (None: anonymous) in Beam's per-process cache. If Beam's internals change it does
nothing, and the tests are only slower.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

_BEAM_AUTH = "apache_beam.internal.gcp.auth"


def prime_beam_credentials_for_emulator() -> None:
    """Under STORAGE_EMULATOR_HOST with no Google credentials: Beam's credential cache says "anonymous" at once.

    Only once Beam's auth module is imported; before that, when it is.
    """
    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        return
    auth = sys.modules.get(_BEAM_AUTH)
    if auth is None:
        if not any(isinstance(finder, _PrimeOnImport) for finder in sys.meta_path):
            sys.meta_path.insert(0, _PrimeOnImport())
        return
    cache = getattr(auth, "_Credentials", None)
    if cache is None or not hasattr(cache, "_credentials_init") or not hasattr(cache, "_credentials_lock"):
        return
    try:
        import google.auth
        import google.auth.exceptions
    except ImportError:
        return
    with cache._credentials_lock:
        if cache._credentials_init:
            return
        try:
            google.auth.default()
            return
        except google.auth.exceptions.DefaultCredentialsError:
            cache._credentials, cache._credentials_init = None, True


class _PrimeOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when Beam's auth module is found, primes its cache right after it runs."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _BEAM_AUTH:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            prime_beam_credentials_for_emulator()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


prime_beam_credentials_for_emulator()
