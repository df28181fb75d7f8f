"""gear-rl's runtime requirements for a verl environment, one per line (standard library only,
so it runs before gear-rl is installed there): pyproject.toml's ``dependencies`` less torch
(the environment's own build is kept) and its ``envs`` extra (TextArena, so that
``SETTING=textarena:GAME`` runs in verl's ``gear_env`` agent loop), with math-verify's antlr
4.9.3 grammar instead of the default 4.13.2, because hydra-core 1.3.8, which verl's trainer
imports, pins antlr4-python3-runtime 4.9.3. Used by scripts/setup_verl_cpu.sh and
scripts/device_check.sh.

    python scripts/verl_requirements.py pyproject.toml > requirements.txt
"""

from __future__ import annotations

import re
import sys

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def main(pyproject: str) -> int:
    with open(pyproject, "rb") as handle:
        project = tomllib.load(handle)["project"]
    deps = [*project["dependencies"], *project.get("optional-dependencies", {}).get("envs", [])]
    for dep in deps:
        if re.match(r"torch\b", dep):
            continue
        print(re.sub(r"^math-verify\[antlr4_13_2\]", "math-verify[antlr4_9_3]", dep))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
