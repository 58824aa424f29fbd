"""The example configuration that ships with gridpilot: the service settings and the
resources tree, from the source tree's ``conf/`` or, installed, from
``<prefix>/share/gridpilot/`` (the package's data files)."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from taskqueue.core.errors import ConfigurationError

#: Example name → file name.
EXAMPLES = {"gridpilot": "gridpilot.toml", "resources": "resources.toml"}
SHARE = Path("share") / "gridpilot"


def example_text(name: str) -> str:
    """The text of the example ``name`` (gridpilot or resources)."""
    if name not in EXAMPLES:
        raise ConfigurationError(f"no example {name!r}: choose {' or '.join(EXAMPLES)}")
    for folder in _folders():
        candidate = folder / EXAMPLES[name]
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
    raise ConfigurationError(f"the example {EXAMPLES[name]} is not installed (looked in "
                             f"{', '.join(str(f) for f in _folders())})")


def _folders() -> list[Path]:
    here = Path(__file__).resolve().parent
    found = [here.parent / "conf"]  # a source checkout or an editable install
    for prefix in (sysconfig.get_path("data"), sys.prefix, here.parents[0]):
        # pip --target puts the data files beside the packages
        folder = Path(prefix) / SHARE
        if folder not in found:
            found.append(folder)
    return found
