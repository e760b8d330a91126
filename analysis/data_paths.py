"""Where the analysis reports find the reference measurements shipped with the package.

Out: ``REFERENCE``, the folder of published rows copied into ``sim/data/reference/`` (each CSV names its source
per row); the fitting script and the reports read the same copy, never ``../shared``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

REFERENCE = Path(str(resources.files("sim").joinpath("data/reference")))
