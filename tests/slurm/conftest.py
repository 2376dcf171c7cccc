"""tests/slurm needs a real SLURM (root, daemons): only `make test-slurm` collects it, not `make test`.

`pytest` from the repo root skips test_slurm.py unless SHARDSMITH_SLURM_TEST=1 (what `make test-slurm`
sets); naming the file on the command line also runs it. The package's ``__init__.py`` keeps this
conftest from shadowing ``tests/conftest.py``, which the other test files import as ``conftest``.
"""

import os

collect_ignore = [] if os.environ.get("SHARDSMITH_SLURM_TEST") == "1" else ["test_slurm.py"]
