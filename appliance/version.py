"""What this build is: the package version (from the installed distribution's metadata, so a
wheel, an editable checkout and `pip show ckptgw` agree) and the on-disk store format it reads
and writes (cache.index.FORMAT: a store of another format is refused at open)."""
from __future__ import annotations

import platform
from importlib import metadata

from cache.index import FORMAT

DISTRIBUTION = "ckptgw"
STORE_FORMAT = FORMAT.decode()


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:         # run from a checkout that was never installed
        return "0+unknown"


def python_version() -> str:
    return platform.python_version()


def describe() -> str:
    """`ckptgw --version`: "ckptgw 0.1.0 (store format ckptgw-store/1, Python 3.11.2)"."""
    return f"ckptgw {version()} (store format {STORE_FORMAT}, Python {python_version()})"
